package schemas_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// TestDictGroupsSameBytes: the encoder's dictionary groups (dictgroup.go)
// write exactly the bytes of per-column adds, whatever the records: the
// capture's binary form, text, both mixed, strings that share an address
// with another length, strings too long for a group key, more tuples than
// the table holds, a wave of new tuples that switches the groups off
// mid-message, and every wire form; each also with every tuple hashed
// alike, so the compare alone tells them apart.
func TestDictGroupsSameBytes(t *testing.T) {
	t.Cleanup(func() { schemas.SetDictGroups(true) })
	real := realistic(t)[:4096] // several of the groups' windows
	text := func(in []schemas.Flow) []schemas.Flow {
		out := make([]schemas.Flow, len(in))
		for i := range in {
			out[i] = in[i]
			out[i].FillText()
			out[i].Bin = schemas.FlowBin{}
		}
		return out
	}
	mixed := func(in []schemas.Flow) []schemas.Flow {
		out := text(in)
		for i := 0; i < len(out); i += 3 {
			out[i] = in[i]
		}
		return out
	}
	// One backing string sliced at the same address with other lengths:
	// "t", "te", "ten"… are different values at one pointer.
	shared := func(in []schemas.Flow) []schemas.Flow {
		out := text(in)
		base := strings.Repeat("tenant-0123456789abcdef", 4)
		for i := range out {
			out[i].TenantID = base[:1+i%len(base)]
			out[i].Zone = base[:1+(i/7)%5]
		}
		return out
	}
	long := func(in []schemas.Flow) []schemas.Flow {
		out := text(in)
		big := strings.Repeat("x", 1<<16+8)
		for i := 0; i < len(out); i += 97 {
			out[i].ServerID = big[:1<<16+i%7]
			out[i].LBID = big[:1<<16-1-i%3]
		}
		return out
	}
	// Every record its own tuple: each a freshly allocated tenant.
	unique := func(in []schemas.Flow) []schemas.Flow {
		out := text(in)
		for i := range out {
			out[i].TenantID = fmt.Sprintf("tenant-%d", i)
			out[i].PeerTenantID = fmt.Sprintf("peer-%d", i)
		}
		return out
	}
	// Unique for a while, then few tuples again: off, then a new message.
	wave := func(in []schemas.Flow) []schemas.Flow {
		out := unique(in)
		for i := len(out) / 2; i < len(out); i++ {
			out[i].TenantID, out[i].PeerTenantID = in[i%7].TenantID, in[i%5].PeerTenantID
		}
		return out
	}
	// Over ten times the tuples a group keeps (groupMaxTuple, 4,096),
	// each seen twice in a row, so the group stays on past its cap.
	many := func(in []schemas.Flow) []schemas.Flow {
		base := text(in[:64])
		out := make([]schemas.Flow, 90_000)
		ports := make([]string, len(out)/2)
		for i := range ports {
			ports[i] = fmt.Sprintf("port-%d", i)
		}
		for i := range out {
			out[i] = base[(i/2)%len(base)]
			out[i].PortID = ports[i/2]
			out[i].SrcIP = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()
		}
		return out
	}
	sets := []struct {
		name string
		recs []schemas.Flow
	}{
		{"binary", real},
		{"text", text(real)},
		{"mixed", mixed(real)},
		{"shared address", shared(real)},
		{"long strings", long(real)},
		{"unique tuples", unique(real)},
		{"wave", wave(real)},
		{"more tuples than kept", many(real)},
		{"one record", real[:1]},
		{"empty", nil},
	}
	forms := []struct {
		name string
		enc  func(*schemas.Encoder) *schemas.Encoder
	}{
		{"narrow", func(e *schemas.Encoder) *schemas.Encoder { return e }},
		{"wide", (*schemas.Encoder).WideIndices},
		{"plain", (*schemas.Encoder).PlainStrings},
	}
	t.Cleanup(func() { schemas.SetDictGroupsCollide(false) })
	for _, set := range sets {
		for _, form := range forms {
			for _, collide := range []bool{false, true} {
				name := set.name + "/" + form.name
				if collide && (form.name != "narrow" || len(set.recs) > 5000) {
					// The other forms differ from narrow only after the
					// groups; one hash probes every tuple (quadratic).
					continue
				}
				if collide {
					name += "/one hash"
				}
				t.Run(name, func(t *testing.T) {
					schemas.SetDictGroupsCollide(collide)
					var out [2][]byte
					for i, on := range []bool{false, true} {
						schemas.SetDictGroups(on)
						enc, err := schemas.NewEncoder(schemas.CodecNone)
						if err != nil {
							t.Fatal(err)
						}
						// Twice: the second message reuses the pooled tables.
						for range 2 {
							if out[i], err = form.enc(enc).Encode(out[i][:0], set.recs); err != nil {
								t.Fatal(err)
							}
						}
					}
					if !bytes.Equal(out[0], out[1]) {
						t.Fatalf("groups wrote %d bytes that differ from per-column adds' %d", len(out[1]), len(out[0]))
					}
					got, err := schemas.NewDecoder().Decode(nil, out[1])
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != len(set.recs) {
						t.Fatalf("decoded %d records, want %d", len(got), len(set.recs))
					}
					for i := range got {
						want := set.recs[i]
						want.FillText()
						want.Bin = schemas.FlowBin{}
						if got[i] != want {
							t.Fatalf("record %d:\n got %+v\nwant %+v", i, got[i], want)
						}
					}
				})
			}
		}
	}
}
