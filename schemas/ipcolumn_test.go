package schemas_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/tapflow/tapflow/schemas"
)

// ipFlows is n binary records (as the capture writes them) whose source
// and destination are src(i) and dst(i).
func ipFlows(n int, src, dst func(i int) netip.Addr) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: "cmp-1", Direction: "tx", Zone: "miss", RecordIndex: int32(i),
			Bin: schemas.FlowBin{Valid: true, Dir: schemas.DirTX, VMMAC: 0xfa163e000001, SrcIP: src(i), DstIP: dst(i)}}
	}
	return recs
}

func v4(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// TestIPColumn: src_ip and dst_ip travel as dictionaries in the narrow
// form when a message's addresses repeat, with the narrowest index, and
// as plain utf8 when most rows bring an address of their own (past 1,024
// distinct, more than three in four rows: the switch happens mid-message
// and keeps the rows before it) and in the forms of older agents. Every
// case decodes to the same text with tapflow's decoder and with
// arrow-go's reader, for v4, v6, v4-mapped, the zero address, a zone and
// text records.
func TestIPColumn(t *testing.T) {
	mixed := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("::ffff:192.0.2.7"),
		netip.MustParseAddr("2001:db8::1"), {}, netip.MustParseAddr("fe80::1%tap0"), netip.IPv4Unspecified(), netip.IPv6Unspecified()}
	vm := netip.MustParseAddr("10.9.9.9")
	for _, tc := range []struct {
		name     string
		form     string // narrow (the default), wide or plain
		recs     []schemas.Flow
		src, dst string // the wire type: int8, int16 (dictionary indices) or utf8
	}{
		{"one VM, 100 peers", "narrow", ipFlows(5000, func(int) netip.Addr { return vm }, func(i int) netip.Addr { return v4(i % 100) }), "int8", "int8"},
		{"1,000 peers: int16", "narrow", ipFlows(5000, func(int) netip.Addr { return vm }, func(i int) netip.Addr { return v4(i % 1000) }), "int8", "int16"},
		{"every row its own address: utf8", "narrow", ipFlows(3000, v4, func(i int) netip.Addr { return v4(i % 3) }), "utf8", "int8"},
		{"half the rows the VM's: dictionary", "narrow", ipFlows(16384, func(i int) netip.Addr {
			if i%2 == 0 {
				return vm
			}
			return v4(i)
		}, func(int) netip.Addr { return vm }), "int16", "int8"},
		{"distinct late in the message", "narrow", ipFlows(6000, func(i int) netip.Addr {
			if i < 1000 { // then 5,000 distinct: the switch comes at row ~4,000
				return vm
			}
			return v4(i)
		}, func(int) netip.Addr { return vm }), "utf8", "int8"},
		{"v4, v6, mapped, zero, zone", "narrow", ipFlows(700, func(i int) netip.Addr { return mixed[i%len(mixed)] }, func(i int) netip.Addr { return mixed[(i/3)%len(mixed)] }), "int8", "int8"},
		{"text records", "narrow", textIPs(2000, func(i int) string { return []string{"10.0.0.1", "", "fd00::1", "not an address"}[i%4] }), "int8", "int8"},
		{"text records, every row its own", "narrow", textIPs(2000, func(i int) string { return fmt.Sprint("x", i) }), "utf8", "int16"},
		{"binary and text records in one message", "narrow", append(ipFlows(300, v4, func(i int) netip.Addr { return vm }),
			textIPs(300, func(i int) string { return v4(i).String() })...), "int16", "int16"},
		{"wide form: utf8", "wide", ipFlows(500, func(int) netip.Addr { return vm }, func(int) netip.Addr { return vm }), "utf8", "utf8"},
		{"plain form: utf8", "plain", ipFlows(500, func(int) netip.Addr { return vm }, func(int) netip.Addr { return vm }), "utf8", "utf8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := schemas.NewEncoder(schemas.CodecLZ4)
			if err != nil {
				t.Fatal(err)
			}
			switch tc.form {
			case "wide":
				enc = enc.WideIndices()
			case "plain":
				enc = enc.PlainStrings()
			}
			body, got := roundTrip(t, enc, tc.recs)
			want := make([][2]string, len(tc.recs))
			for i, r := range tc.recs {
				if r.Bin.Valid {
					want[i] = [2]string{r.SrcIPText(), r.DstIPText()}
				} else {
					want[i] = [2]string{r.SrcIP, r.DstIP}
				}
			}
			for i, r := range got {
				if [2]string{r.SrcIP, r.DstIP} != want[i] {
					t.Fatalf("row %d: decoded %q %q, want %q", i, r.SrcIP, r.DstIP, want[i])
				}
			}
			rd, err := ipc.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Release()
			if !rd.Next() {
				t.Fatalf("arrow-go read no batch: %v", rd.Err())
			}
			rec := rd.RecordBatch()
			for j, c := range []struct{ name, want string }{{"src_ip", tc.src}, {"dst_ip", tc.dst}} {
				col := rec.Column(schemas.FlowTable.ColumnIndex(c.name))
				if typ := wireType(col.DataType()); typ != c.want {
					t.Errorf("%s: wire type %s (%s), want %s", c.name, typ, col.DataType(), c.want)
				}
				for i := range want {
					if v := byValue(col, i); v != want[i][j] {
						t.Fatalf("%s row %d: arrow-go reads %q, want %q", c.name, i, v, want[i][j])
					}
				}
			}
		})
	}
}

// roundTrip encodes recs with enc and decodes the body with tapflow's
// decoder.
func roundTrip(t *testing.T, enc *schemas.Encoder, recs []schemas.Flow) ([]byte, []schemas.Flow) {
	t.Helper()
	body, err := enc.Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := schemas.NewDecoder().Decode(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	return body, got
}

func textIPs(n int, ip func(i int) string) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: "cmp-1", Direction: "rx", Zone: "miss", SrcIP: ip(i), DstIP: ip(i / 2)}
	}
	return recs
}

func wireType(t arrow.DataType) string {
	if d, ok := t.(*arrow.DictionaryType); ok {
		return d.IndexType.String()
	}
	return t.String()
}

// byValue reads row i of a string column of either form, as the Go
// subscriber example does.
func byValue(a arrow.Array, i int) string {
	switch a := a.(type) {
	case *array.String:
		return a.Value(i)
	case *array.Dictionary:
		return a.Dictionary().(*array.String).Value(a.GetValueIndex(i))
	}
	return fmt.Sprintf("<%s>", a.DataType())
}

// TestIPColumnReuse: one encoder's messages in turn, each with other
// addresses and another form (dictionary, the switch to utf8, a small
// message), reuse the arena's address tables and buffers: every message
// decodes to exactly its own addresses (no entry of an earlier message
// shows through), and the encoder keeps no more arenas than its bound.
func TestIPColumnReuse(t *testing.T) {
	enc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		t.Fatal(err)
	}
	shapes := []func(m int) []schemas.Flow{
		func(m int) []schemas.Flow { // 2,000 of 6,000 rows distinct: int16 dictionary, tables grown
			return ipFlows(6000, func(i int) netip.Addr { return v4(m<<16 | i%2000) }, func(i int) netip.Addr { return v4(m<<16 | i%7) })
		},
		func(m int) []schemas.Flow { // every row its own: utf8 after the switch
			return ipFlows(5000, func(i int) netip.Addr { return v4(m<<16 | i) }, func(i int) netip.Addr { return v4(m<<16 | 1) })
		},
		func(m int) []schemas.Flow { // small
			return ipFlows(40, func(i int) netip.Addr { return v4(m<<16 | i%3) }, func(i int) netip.Addr { return v4(m<<16 | i%5) })
		},
	}
	for m := range 30 { // 10× each shape
		recs := shapes[m%len(shapes)](m)
		_, got := roundTrip(t, enc, recs)
		for i, r := range got {
			if w := [2]string{recs[i].SrcIPText(), recs[i].DstIPText()}; [2]string{r.SrcIP, r.DstIP} != w {
				t.Fatalf("message %d row %d: decoded %q %q, want %q", m, i, r.SrcIP, r.DstIP, w)
			}
		}
	}
	if n := enc.IdleArenas(); n > 2 {
		t.Fatalf("the encoder keeps %d arenas, want at most 2", n)
	}
}
