package schemas_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/tapflow/tapflow/internal/testkit/wirecraft"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/schemas/columns"
)

// dictSample is n records whose strings are built per record (distinct
// pointers, so the encoder's pointer fast path does not hide its scan
// and map), with columns of 1, 2, 7 and n distinct values.
func dictSample(n int) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{
			TimeEnd: int64(i), Node: "cmp-1", Direction: []string{"tx", "rx"}[i%2],
			Ifname: fmt.Sprintf("tap%d", i%7), VMMAC: fmt.Sprintf("fa:16:3e:00:%02x:%02x", i/256%256, i%256),
			PortID: fmt.Sprintf("port-%d", i%13), TenantID: strings.Repeat("t", 1+i%20), AgentID: "agent-a",
			SrcIP: fmt.Sprint(i), RecordIndex: int32(i), PoolID: "", MemberID: fmt.Sprint(i % 3),
		}
	}
	return recs
}

// TestWireForms: every codec, every wire form (dictionaries with narrow
// indices, the default; int32 indices and plain utf8 from agents before
// them), both decoders (records and the collector's rows) give back the
// same values, and the dictionary forms are what the schema says: Dict
// columns dictionary<int8|int16|int32, utf8>, other strings utf8 — but
// for an IP column whose values repeat in the narrow form (dst_ip: one
// value; src_ip, a value per row, stays utf8; TestIPColumn has the rule).
func TestWireForms(t *testing.T) {
	recs := dictSample(3000)
	cols := schemas.FlowTable.Columns()
	for _, codec := range schemas.Codecs {
		for _, form := range []string{"narrow", "wide", "plain"} {
			plain := form == "plain"
			t.Run(fmt.Sprintf("%s/%s", codec, form), func(t *testing.T) {
				enc, err := schemas.NewEncoder(codec)
				if err != nil {
					t.Fatal(err)
				}
				switch form {
				case "plain":
					enc = enc.PlainStrings()
				case "wide":
					enc = enc.WideIndices()
				}
				body, got := roundTrip(t, enc, recs)
				if !reflect.DeepEqual(got, recs) {
					t.Fatal("records differ after the round trip")
				}
				// Rows must not alias the caller's body (the decoder
				// slices bodies it need not copy): clobber it.
				in := bytes.Clone(body)
				rows, err := schemas.NewDecoderFor(schemas.FlowRows).Decode(nil, in)
				if err != nil {
					t.Fatal(err)
				}
				clear(in)
				wantDict := func(c columns.Column) bool {
					switch c.Name {
					case "src_ip": // a value per row
						return false
					case "dst_ip": // one value; the older forms send utf8
						return form == "narrow"
					}
					return c.Dict && !plain
				}
				for k, c := range cols {
					if c.Kind != columns.String {
						continue
					}
					if dict := rows[0].Chunk().DictKeys(k) != nil; dict != wantDict(c) {
						t.Errorf("column %s: row chunk dictionary-encoded %v, want %v", c.Name, dict, wantDict(c))
					}
					for i, r := range rows {
						want := reflect.ValueOf(recs[i]).FieldByName(c.GoName).String()
						if r.String(k) != want {
							t.Fatalf("row %d column %s: %q, want %q", i, c.Name, r.String(k), want)
						}
					}
				}
				if codec == schemas.CodecZstd {
					return
				}
				r, err := ipc.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer r.Release()
				for _, c := range cols {
					f, _ := r.Schema().FieldsByName(c.Name)
					dt, isDict := f[0].Type.(*arrow.DictionaryType)
					if isDict != wantDict(c) {
						t.Errorf("column %s: wire type %s", c.Name, f[0].Type)
					}
					if isDict && form == "wide" && dt.IndexType.ID() != arrow.INT32 {
						t.Errorf("column %s: wide form's index type %s", c.Name, dt.IndexType)
					}
				}
			})
		}
	}
}

// TestEncoderReuse: one encoder reuses its column buffers from message to
// message; batches of other sizes, strings and forms, encoded in turn and
// from several goroutines, each decode to exactly their records (no
// value of an earlier message shows through).
func TestEncoderReuse(t *testing.T) {
	batches := [][]schemas.Flow{dictSample(1000), dictSample(10), dictSample(2000), nil, dictSample(1)}
	long := dictSample(200)
	for i := range long { // IPv6 texts outgrow the string buffers' first size
		long[i].SrcIP, long[i].DstIP = fmt.Sprintf("2001:db8:aaaa:bbbb:cccc:dddd:eeee:%x", i), strings.Repeat("x", i)
	}
	batches = append(batches, long, dictSample(1000))
	for _, codec := range schemas.Codecs {
		enc, err := schemas.NewEncoder(codec)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range []*schemas.Encoder{enc, enc.PlainStrings(), enc.WideIndices()} {
			var wg sync.WaitGroup
			for g := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var body []byte
					var err error
					for round := range 2 {
						for k, recs := range batches {
							if body, err = e.Encode(body[:0], recs); err != nil {
								t.Error(err)
								return
							}
							got, err := schemas.NewDecoder().Decode(nil, body)
							if err != nil {
								t.Error(err)
								return
							}
							if len(got) != len(recs) || (len(recs) > 0 && !reflect.DeepEqual(got, recs)) {
								t.Errorf("%s goroutine %d round %d batch %d: records differ after the round trip", codec, g, round, k)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
		}
	}
}

// TestNarrowIndices: the index type is the narrowest signed one that
// holds the message's dictionary, at each bound, and the values round
// trip through both decoders.
func TestNarrowIndices(t *testing.T) {
	for _, tc := range []struct {
		distinct int
		want     arrow.Type
	}{{1, arrow.INT8}, {128, arrow.INT8}, {129, arrow.INT16}, {1 << 15, arrow.INT16}, {1<<15 + 1, arrow.INT32}} {
		recs := make([]schemas.Flow, 1<<15+1)
		for i := range recs {
			recs[i] = schemas.Flow{Node: "cmp-1", PortID: fmt.Sprint(i % tc.distinct), RecordIndex: int32(i)}
		}
		enc, _ := schemas.NewEncoder(schemas.CodecNone)
		body, err := enc.Encode(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ipc.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		f, _ := r.Schema().FieldsByName("port_id")
		if got := f[0].Type.(*arrow.DictionaryType).IndexType.ID(); got != tc.want {
			t.Errorf("%d distinct: index type %s, want %s", tc.distinct, got, tc.want)
		}
		f, _ = r.Schema().FieldsByName("node")
		if got := f[0].Type.(*arrow.DictionaryType).IndexType.ID(); got != arrow.INT8 {
			t.Errorf("node: index type %s, want int8", got)
		}
		r.Release()
		got, err := schemas.NewDecoder().Decode(nil, body)
		if err != nil || !reflect.DeepEqual(got, recs) {
			t.Fatalf("%d distinct: records differ after the round trip (err %v)", tc.distinct, err)
		}
		rows, err := schemas.NewDecoderFor(schemas.FlowRows).Decode(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		k := schemas.FlowTable.ColumnIndex("port_id")
		for i, row := range rows {
			if row.String(k) != recs[i].PortID {
				t.Fatalf("%d distinct: row %d port_id %q, want %q", tc.distinct, i, row.String(k), recs[i].PortID)
			}
		}
	}
}

// TestHostileDictionaries: a dictionary no tapflow writer sends is refused
// by both decoders with an error wrapping ErrCorrupt that names the
// column and the problem, never a panic.
func TestHostileDictionaries(t *testing.T) {
	const n = 50
	recs := dictSample(n)
	cases := []struct {
		name, col string
		arr       func() arrow.Array
		want      string
	}{
		{"index out of range", "zone", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(n, 3, 17, 3), wirecraft.Strings("a", "b", "c"))
		}, "column zone: row 17: dictionary index 3 out of range [0, 3)"},
		{"negative index", "tenant_id", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(n, 2, 0, -1), wirecraft.Strings("a", "b"))
		}, "dictionary index -1 out of range"},
		{"int16 index out of range", "node", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int16, wirecraft.Keys(n, 2, 49, 300), wirecraft.Strings("a", "b"))
		}, "row 49: dictionary index 300 out of range [0, 2)"},
		{"int64 index out of range", "node", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int64, wirecraft.Keys(n, 2, 5, 1<<40), wirecraft.Strings("a", "b"))
		}, "row 5: dictionary index 1099511627776 out of range"},
		{"unsigned 32-bit index", "node", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Uint32, wirecraft.Keys(n, 2, -1, 0), wirecraft.Strings("a", "b"))
		}, "dictionary index type uint32"},
		{"dictionary of int64", "direction", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(n, 2, -1, 0), wirecraft.Int64s(1, 2))
		}, "column direction: got dictionary<values=int64"},
		{"dictionary on an int column", "bytes", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(n, 2, -1, 0), wirecraft.Int64s(1, 2))
		}, "column bytes: got dictionary"},
		{"huge dictionary", "port_id", func() arrow.Array {
			return wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(n, 2, -1, 0), wirecraft.NStrings(n+4097))
		}, "column port_id: dictionary of 4147 entries for 50 rows"},
	}
	decoders := map[string]func([]byte) error{
		"records": func(b []byte) error { _, err := schemas.NewDecoder().Decode(nil, b); return err },
		"rows":    func(b []byte) error { _, err := schemas.NewDecoderFor(schemas.FlowRows).Decode(nil, b); return err },
	}
	for _, tc := range cases {
		body, err := wirecraft.Body(recs, tc.col, tc.arr())
		if err != nil {
			t.Fatal(err)
		}
		for dn, decode := range decoders {
			t.Run(tc.name+"/"+dn, func(t *testing.T) {
				err := decode(body)
				if !errors.Is(err, schemas.ErrCorrupt) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "panicked") {
					t.Fatalf("error %v, want ErrCorrupt containing %q", err, tc.want)
				}
			})
		}
	}
	// The same crafting with a valid dictionary decodes: the refusals are
	// the hostile values, not the hand-made stream.
	body, err := wirecraft.Body(recs, "zone", wirecraft.Dict(arrow.PrimitiveTypes.Int16, wirecraft.Keys(n, 3, -1, 0), wirecraft.Strings("a", "b", "c")))
	if err != nil {
		t.Fatal(err)
	}
	for dn, decode := range decoders {
		if err := decode(body); err != nil {
			t.Errorf("%s: valid int16 dictionary refused: %v", dn, err)
		}
	}
	got, _ := schemas.NewDecoder().Decode(nil, body)
	if got[4].Zone != "b" {
		t.Errorf("zone of record 4 = %q, want b", got[4].Zone)
	}
}

// TestDictionaryCache: the encoder's pointer and MAC caches (used past
// dictScan values) never change a value. Messages mix strings shared by
// pointer, equal strings at other addresses, thousands of distinct
// values (the caches grow mid-message), prefixes of values (same
// address, another length), binary MACs past the scan and
// text MACs in the same column; each message is built from new strings
// (addresses the pooled caches saw in an earlier message may hold other
// values now), half of them equal to an earlier message's (a pooled
// string map must not remember them). Every message decodes to the
// text form of its records.
func TestDictionaryCache(t *testing.T) {
	for _, c := range []struct {
		name     string
		n, width int // records, distinct values per column
	}{{"few values", 4000, 5}, {"past the scan", 4000, 40}, {"caches grow", 20000, 3000}, {"every record distinct", 5000, 5000}} {
		t.Run(c.name, func(t *testing.T) {
			enc, err := schemas.NewEncoder(schemas.CodecNone)
			if err != nil {
				t.Fatal(err)
			}
			for msg := range 3 {
				vals := make([]string, c.width)
				for i := range vals {
					vals[i] = fmt.Sprintf("m%d-value-%d", msg*(i%2), i) // half of them in every message
				}
				recs, want := make([]schemas.Flow, c.n), make([]schemas.Flow, c.n)
				for i := range recs {
					v := vals[(i*7+msg)%c.width]
					switch {
					case i%5 == 0:
						v = strings.Clone(v) // equal bytes elsewhere
					case i%7 == 0:
						v = v[:len(v)-2] // a prefix: the same address, another length
					}
					r := schemas.Flow{Node: "cmp-1", Direction: "tx", Zone: "miss", TenantID: v, ServerID: vals[i%c.width], PortID: v, RecordIndex: int32(i)}
					w := r
					mac := uint64(0xfa163e000000) + uint64((i*3+msg)%c.width)
					w.VMMAC, w.PeerMAC = schemas.FormatMAC(mac), schemas.FormatMAC(mac+1)
					if i%4 == 0 {
						r.VMMAC, r.PeerMAC = w.VMMAC, w.PeerMAC // text MACs in the same columns
					} else {
						r.Bin = schemas.FlowBin{Valid: true, Dir: schemas.DirTX, VMMAC: mac, PeerMAC: mac + 1}
					}
					recs[i], want[i] = r, w
				}
				_, got := roundTrip(t, enc, recs)
				for i := range want {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("message %d record %d:\ngot  %+v\nwant %+v", msg, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// TestRowAgentID: a row's AgentID is its record's agent_id whether the
// batch has one agent (interned without a per-row index) or several,
// the second appearing first at row 0, midway or at the last row.
func TestRowAgentID(t *testing.T) {
	n := 1000
	for _, tc := range []struct {
		name  string
		agent func(i int) string
	}{
		{"one", func(int) string { return "agent-a" }},
		{"second-midway", func(i int) string { return []string{"agent-a", "agent-b"}[i*2/n] }},
		{"second-last", func(i int) string { return []string{"agent-a", "agent-b"}[i/(n-1)] }},
		{"alternating", func(i int) string { return []string{"agent-a", "agent-b", "agent-c"}[i%3] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := dictSample(n)
			for i := range recs {
				recs[i].AgentID = tc.agent(i)
			}
			enc, err := schemas.NewEncoder(schemas.CodecLZ4)
			if err != nil {
				t.Fatal(err)
			}
			body, err := enc.Encode(nil, recs)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := schemas.NewDecoderFor(schemas.FlowRows).Decode(nil, body)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rows {
				if r.AgentID() != recs[i].AgentID {
					t.Fatalf("row %d: agent %q, want %q", i, r.AgentID(), recs[i].AgentID)
				}
			}
		})
	}
}
