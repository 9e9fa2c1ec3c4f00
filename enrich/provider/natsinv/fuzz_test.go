package natsinv

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/transport"
)

// Hostile snapshots, deltas and local copies: what an agent receives over
// NATS or reads from its disk. Each target asserts no panic, bounded
// allocation (the fuzzer's RSS limit) and an error, never a half-built
// inventory.

func fuzzCloud() *inventory.Inventory {
	return Normalize(synth.Generate(synth.Options{Tenants: 3, VMsPerTenant: 2, LoadBalancers: 1, FloatingIPsPerTenant: 1}))
}

// gobMapBomb is the delta body of the map form the decoder no longer
// reads: a map declaring 2^28 entries in 5 bytes.
func gobMapBomb(t testing.TB) []byte {
	type old struct {
		Upsert inventory.Inventory
		Delete map[string][]string
	}
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(old{Delete: map[string][]string{"x": {"y"}}}); err != nil {
		t.Fatal(err)
	}
	raw := b.Bytes()
	i := bytes.LastIndex(raw, []byte{1, 1, 'x'})
	if i < 0 {
		t.Fatal("map count not found")
	}
	mod := append([]byte{}, raw[:i]...)
	mod = append(mod, 0xFC, 0x10, 0, 0, 0) // 2^28
	return append(mod, raw[i+1:]...)
}

// zstdSizeLie is a zstd frame declaring size bytes of content, followed by
// one block of the reserved type: the decoder used to allocate the
// declared size before finding the block invalid.
func zstdSizeLie(size uint64) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0} // magic; single segment, 8-byte content size
	b = binary.LittleEndian.AppendUint64(b, size)
	return append(b, 0x07, 0x00, 0x00) // last block, reserved type
}

func TestDecodeChecksDeclaredSize(t *testing.T) {
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"879 MiB in 16 bytes", zstdSizeLie(879 << 20), "more than zstd can expand to"},
		{"beyond the limit", zstdSizeLie(maxDecoded + 1), "more than the"},
		{"no size", []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x30, 0x07, 0x00, 0x00}, "does not declare its size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Decode(c.data)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Errorf("allocated %d bytes refusing it", got)
			}
		})
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	data, _, err := Encode(fuzzCloud())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	empty, _, _ := Encode(&inventory.Inventory{})
	f.Add(empty)
	f.Add([]byte{})
	f.Add(data[:len(data)/2])                        // truncated
	f.Add(encoder.EncodeAll([]byte("not gob"), nil)) // zstd of garbage
	f.Add(encoder.EncodeAll(gobMapBomb(f), nil))
	f.Add(encoder.EncodeAll(make([]byte, 1<<20), nil)) // 1 MiB of zeros
	f.Add(zstdSizeLie(879 << 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := Decode(data)
		if err != nil {
			if inv != nil {
				t.Fatal("an inventory with an error")
			}
			return
		}
		// What the agent does with it next: index it for attribution.
		snapshot.Build(inv, snapshot.Options{Version: 1})
	})
}

func FuzzDecodeDelta(f *testing.F) {
	base := fuzzCloud()
	next := *base
	next.Ports = append([]inventory.Port(nil), base.Ports[1:]...)
	next.Ports = append(next.Ports, inventory.Port{ID: "new", MACAddress: "fa:16:3e:99:99:99", NetworkID: base.Ports[0].NetworkID})
	next.Servers = base.Servers[1:]
	nn := Normalize(&next)
	s := &Snapshot{Version: 8, FetchedAt: time.Unix(1700000000, 0), Inv: nn}
	m, err := encodeDelta(7, s, Diff(base, nn))
	if err != nil {
		f.Fatal(err)
	}
	hdr := func(h nats.Header) string {
		var b bytes.Buffer
		_ = http.Header(h).Write(&b)
		return b.String()
	}
	f.Add(hdr(m.Header), m.Data)
	f.Add(hdr(m.Header), []byte{})
	f.Add(hdr(m.Header), zstdSizeLie(879<<20))
	f.Add(hdr(m.Header), encoder.EncodeAll(gobMapBomb(f), nil))
	var unknown bytes.Buffer
	_ = gob.NewEncoder(&unknown).Encode(&deltaWire{Gone: []deleted{{Coll: "nope", IDs: []string{"a"}}}})
	f.Add(hdr(m.Header), encoder.EncodeAll(unknown.Bytes(), nil))
	bad := nats.Header(http.Header(m.Header).Clone())
	bad.Set(hdrBase, "18446744073709551615") // base+1 wraps to 0
	bad.Set(hdrVersion, "0")
	f.Add(hdr(bad), m.Data)
	bad = nats.Header(http.Header(m.Header).Clone())
	bad.Set(hdrPorts, "-1")
	f.Add(hdr(bad), m.Data)
	f.Fuzz(func(t *testing.T, header string, data []byte) {
		h := nats.Header{}
		for _, line := range bytes.Split([]byte(header), []byte("\r\n")) {
			if k, v, ok := bytes.Cut(line, []byte(": ")); ok {
				h.Add(string(k), string(v))
			}
		}
		baseV, snap, ports, c, err := decodeDelta(&nats.Msg{Subject: transport.InventoryDeltaSubject, Header: h, Data: data})
		if err != nil {
			if c != nil {
				t.Fatal("changes with an error")
			}
			return
		}
		if baseV+1 != snap.Version || snap.Version == 0 {
			t.Fatalf("base %d for version %d accepted", baseV, snap.Version)
		}
		_ = ports
		// What the agent does next: apply it to the version held, and
		// index the result.
		inv := Apply(base, c)
		snapshot.Build(inv, snapshot.Options{Version: int64(snap.Version)})
	})
}

func FuzzReadState(f *testing.F) {
	inv := fuzzCloud()
	data, digest, err := Encode(inv)
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	p := filepath.Join(dir, "inventory.state")
	if err := writeState(p, &Snapshot{Version: 3, FetchedAt: time.Unix(1700000000, 5), Digest: digest, Inv: inv}, data); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(stateMagic)+18])             // header only
	f.Add(good[:len(good)-7])                    // truncated body
	f.Add(append([]byte(nil), stateMagic...))    // magic only
	f.Add([]byte("TFINV2\n" + string(good[7:]))) // another format
	long := append([]byte(nil), good[:len(stateMagic)+16]...)
	long = binary.BigEndian.AppendUint16(long, 0xffff) // digest longer than the file
	f.Add(append(long, good[len(stateMagic)+18:]...))
	zero := append([]byte(nil), good...)
	copy(zero[len(stateMagic):], make([]byte, 8)) // version 0
	f.Add(zero)
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := parseState(raw, "inventory.state")
		if err != nil {
			if s != nil {
				t.Fatal("a snapshot with an error")
			}
			return
		}
		if s.Version == 0 || s.Inv == nil {
			t.Fatalf("accepted version %d, inventory %v", s.Version, s.Inv != nil)
		}
	})
}

// TestDownloadChecksDeclaredSize: the object's metadata sizes the
// download buffer only within the snapshot limit (2^62 bytes used to be
// a makeslice panic, 900 MiB an allocation of it).
func TestDownloadChecksDeclaredSize(t *testing.T) {
	for _, size := range []uint64{1 << 62, maxDecoded + 1} {
		info := &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: transport.InventoryObject}, NUID: "x", Size: size, Chunks: 1}
		_, err := Download(context.Background(), nil, info)
		if err == nil || !strings.Contains(err.Error(), "more than the") {
			t.Errorf("size %d: err %v", size, err)
		}
	}
}

// FuzzAnnouncedVersion: any announcement body (a plain subscription on the
// meta subject: anyone allowed to publish there) yields a version or 0,
// never a panic; a version only when the headers parse as the snapshot's.
func FuzzAnnouncedVersion(f *testing.F) {
	h := nats.Header{}
	h.Set(hdrFormat, Format)
	h.Set(hdrVersion, "9")
	h.Set(hdrFetched, time.Unix(1700000000, 0).UTC().Format(time.RFC3339Nano))
	good, err := json.Marshal(jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: transport.InventoryObject, Headers: h}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"headers":{"Tapflow-Version":["18446744073709551615"]}}`))
	f.Add([]byte(`{"headers":"x"}`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		v := announcedVersion(data)
		if v == 0 {
			return
		}
		var info jetstream.ObjectInfo
		if err := json.Unmarshal(data, &info); err != nil {
			t.Fatalf("version %d from a body that is not JSON: %v", v, err)
		}
		if m, err := meta(info.Headers); err != nil || m.Version != v {
			t.Fatalf("version %d, headers say %d (%v)", v, m.Version, err)
		}
	})
}
