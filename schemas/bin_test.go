package schemas

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// TestBinaryEncodesAsText: a binary record (FlowBin) and the same record
// in text encode to identical columns, for v4, v6, v4-mapped, the zero
// address and group MACs; decoded records are text.
func TestBinaryEncodesAsText(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bin      FlowBin
		vm, peer string
		src, dst string
	}{
		{"v4", FlowBin{VMMAC: 0xfa163e00ab01, PeerMAC: 0xfa163e00cd02, SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: netip.MustParseAddr("8.8.8.8")},
			"fa:16:3e:00:ab:01", "fa:16:3e:00:cd:02", "10.0.0.5", "8.8.8.8"},
		{"v6", FlowBin{VMMAC: 1, PeerMAC: 0xffffffffffff, SrcIP: netip.MustParseAddr("fd00::5"), DstIP: netip.MustParseAddr("2001:db8::1")},
			"00:00:00:00:00:01", "ff:ff:ff:ff:ff:ff", "fd00::5", "2001:db8::1"},
		{"v4-mapped v6", FlowBin{VMMAC: 0x01005e0000fb, SrcIP: netip.MustParseAddr("::ffff:192.0.2.7"), DstIP: netip.IPv4Unspecified()},
			"01:00:5e:00:00:fb", "00:00:00:00:00:00", "::ffff:192.0.2.7", "0.0.0.0"},
		{"zero addresses are empty text", FlowBin{}, "00:00:00:00:00:00", "00:00:00:00:00:00", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.bin
			b.Valid, b.Dir = true, DirTX
			bin := Flow{Node: "n", Direction: "tx", Zone: "miss", Bin: b}
			text := Flow{Node: "n", Direction: "tx", Zone: "miss", VMMAC: tc.vm, PeerMAC: tc.peer, SrcIP: tc.src, DstIP: tc.dst}
			if g := [4]string{bin.VMMACText(), bin.PeerMACText(), bin.SrcIPText(), bin.DstIPText()}; g != [4]string{tc.vm, tc.peer, tc.src, tc.dst} {
				t.Fatalf("text accessors %q, want %q", g, [4]string{tc.vm, tc.peer, tc.src, tc.dst})
			}
			enc, err := NewEncoder(CodecNone)
			if err != nil {
				t.Fatal(err)
			}
			got, err := enc.Encode(nil, []Flow{bin, text})
			if err != nil {
				t.Fatal(err)
			}
			out, err := NewDecoder().Decode(nil, got)
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != out[1] || out[0] != text {
				t.Fatalf("decoded\n binary %+v\n text   %+v\nwant %+v", out[0], out[1], text)
			}
			filled := bin
			filled.FillText()
			filled.Bin = FlowBin{}
			if filled != text {
				t.Fatalf("FillText %+v, want %+v", filled, text)
			}
		})
	}
}

// TestDecodeClearsBinary: decoding into reused records leaves none
// marked binary (its text would be ignored).
func TestDecodeClearsBinary(t *testing.T) {
	enc, _ := NewEncoder(CodecNone)
	body, err := enc.Encode(nil, []Flow{{VMMAC: "fa:16:3e:00:00:01"}})
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]Flow, 0, 1)
	dst = append(dst, Flow{Bin: FlowBin{Valid: true, VMMAC: 2}})
	out, err := NewDecoder().Decode(dst[:0], body)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Bin.Valid || out[0].VMMACText() != "fa:16:3e:00:00:01" {
		t.Fatalf("decoded %+v", out[0])
	}
}

// TestMixedBinaryAndTextInOneMessage: one message's dictionary column
// takes binary MACs (keyed on the uint64) and text MACs (keyed on the
// string) in any order, including an empty text MAC between two equal
// binary ones, and with more binary MACs before the first text one than
// the dictionary scans (they go in unindexed until a text value comes);
// every row must decode to its own text, in both wire forms, and no
// dictionary holds a value twice.
func TestMixedBinaryAndTextInOneMessage(t *testing.T) {
	bin := func(mac uint64) Flow {
		return Flow{Direction: "tx", Zone: "miss", Bin: FlowBin{VMMAC: mac, PeerMAC: mac + 1, Valid: true, Dir: DirTX}}
	}
	text := func(mac string) Flow { return Flow{Direction: "tx", Zone: "miss", VMMAC: mac, PeerMAC: mac} }
	many := func() []Flow { // 3 × dictScan binary MACs, then text ones equal to some, then binary again
		var recs []Flow
		for i := range 3 * dictScan {
			recs = append(recs, bin(0xfa163e000100+uint64(i)))
		}
		return append(recs, text("fa:16:3e:00:01:05"), text("fa:16:3e:00:01:01"), text("fa:16:3e:00:09:09"),
			bin(0xfa163e000105), bin(0xfa163e000909), bin(0xfa163e000100+3*dictScan), text("fa:16:3e:00:01:05"))
	}
	for _, tc := range []struct {
		name string
		recs []Flow
	}{
		{"few", []Flow{
			bin(0xfa163e000001), text(""), bin(0xfa163e000001), text("fa:16:3e:00:00:01"),
			bin(0xfa163e000002), bin(0xfa163e000002), text("fa:16:3e:00:00:09"), bin(0xfa163e000001), text(""),
		}},
		{"more binary than the scan first", many()},
	} {
		for _, plain := range []bool{false, true} {
			t.Run(tc.name+"/"+map[bool]string{false: "dictionary", true: "plain"}[plain], func(t *testing.T) {
				enc, err := NewEncoder(CodecNone)
				if err != nil {
					t.Fatal(err)
				}
				if plain {
					enc = enc.PlainStrings()
				}
				body, err := enc.Encode(nil, tc.recs)
				if err != nil {
					t.Fatal(err)
				}
				out, err := NewDecoder().Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				for i, f := range out {
					if want := tc.recs[i].VMMACText(); f.VMMAC != want {
						t.Errorf("row %d: vm_mac %q, want %q", i, f.VMMAC, want)
					}
					if want := tc.recs[i].PeerMACText(); f.PeerMAC != want {
						t.Errorf("row %d: peer_mac %q, want %q", i, f.PeerMAC, want)
					}
				}
				if !plain {
					for _, col := range []string{"vm_mac", "peer_mac"} {
						if dup := duplicateDictValue(t, body, col); dup != "" {
							t.Errorf("%s: dictionary holds %q twice", col, dup)
						}
					}
				}
			})
		}
	}
}

// duplicateDictValue is a value the dictionary of column col holds more
// than once in body's first batch, or "".
func duplicateDictValue(t *testing.T, body []byte, col string) string {
	t.Helper()
	r, err := ipc.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	if !r.Next() {
		t.Fatalf("no batch: %v", r.Err())
	}
	k := r.Schema().FieldIndices(col)
	d, ok := r.RecordBatch().Column(k[0]).(*array.Dictionary)
	if !ok {
		t.Fatalf("%s: %s, want a dictionary", col, r.RecordBatch().Column(k[0]).DataType())
	}
	dict := d.Dictionary().(*array.String)
	seen := map[string]bool{}
	for i := range dict.Len() {
		v := dict.Value(i)
		if seen[v] {
			return v
		}
		seen[v] = true
	}
	return ""
}

func TestAppendIPv4(t *testing.T) {
	for _, s := range []string{"0.0.0.0", "255.255.255.255", "10.0.0.1", "1.22.133.4", "100.64.9.99", "192.168.1.254", "9.99.100.255"} {
		a := netip.MustParseAddr(s)
		if got := string(appendIPv4([]byte("x"), a.As4())); got != "x"+s {
			t.Errorf("appendIPv4(%s) = %q", s, got)
		}
	}
	// every octet in every position against netip's own text
	for o := range 256 {
		for pos := range 4 {
			b := [4]byte{1, 2, 3, 4}
			b[pos] = byte(o)
			want := netip.AddrFrom4(b).String()
			if got := string(appendIPv4(nil, b)); got != want {
				t.Fatalf("appendIPv4(%v) = %q, want %q", b, got, want)
			}
		}
	}
}

// BenchmarkAppendIPv4: the wire's IPv4 text by table against netip's
// AppendTo, same addresses, same run.
func BenchmarkAppendIPv4(b *testing.B) {
	addrs := make([]netip.Addr, 1024)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{byte(10 + i%3), byte(i * 7), byte(i >> 2), byte(i * 13)})
	}
	for _, c := range []struct {
		name string
		fn   func([]byte, netip.Addr) []byte
	}{
		{"netip", func(d []byte, a netip.Addr) []byte { return a.AppendTo(d) }},
		{"table", func(d []byte, a netip.Addr) []byte { return appendIPv4(d, a.As4()) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, 0, 16*len(addrs))
			for b.Loop() {
				buf = buf[:0]
				for _, a := range addrs {
					buf = c.fn(buf, a)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(addrs)), "ns/address")
		})
	}
}
