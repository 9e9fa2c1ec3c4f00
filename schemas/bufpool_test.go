package schemas

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// rowsAsFlows reads rows back as records (every column), for comparing
// what a pooled decode gives with the records encoded.
func rowsAsFlows(t *testing.T, rows []Row) []Flow {
	t.Helper()
	if len(rows) == 0 {
		return nil
	}
	rec := FlowRows.ToArrow(rows)
	defer rec.Release()
	out, err := FlowTable.FromArrow(rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPooledDecode: rows decoded by a pooling decoder read as the records
// encoded, in every codec; their buffers come back to the pool only when
// every row of the message is released, are recycled by the next
// messages, and a row read after its release shows the poison (what the
// sink's release tests rely on to see an early release).
func TestPooledDecode(t *testing.T) {
	for _, codec := range Codecs {
		t.Run(codec, func(t *testing.T) {
			enc, err := NewEncoder(codec)
			if err != nil {
				t.Fatal(err)
			}
			pool := NewBufferPool(8 << 20).Poisoned()
			lim, err := NewDecoderFor(FlowRows).Limited(16<<20, 1<<16)
			if err != nil {
				t.Fatal(err)
			}
			dec := lim.WithPool(pool)
			var held [][]Row
			for i := range 12 {
				want := sample(500 + i)
				for j := range want {
					want[j].BatchSeq = int64(i)
				}
				body, err := enc.Encode(nil, want)
				if err != nil {
					t.Fatal(err)
				}
				rows, err := dec.Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				if got := rowsAsFlows(t, rows); !reflect.DeepEqual(got, want) {
					t.Fatalf("message %d: pooled rows differ from the records encoded", i)
				}
				held = append(held, rows)
				if len(held) == 3 { // a few messages in flight, as between fetch and sink
					ReleaseRows(held[0])
					ReleaseRows(held[0]) // again: a no-op
					held = held[1:]
				}
			}
			for _, rows := range held {
				ReleaseRows(rows)
			}
			st := pool.Stats()
			if st.Messages != 0 || st.Out != 0 {
				t.Fatalf("after releasing every message: %+v", st)
			}
			if codec != CodecZstd && (st.Hits == 0 || st.Returned == 0) {
				// zstd bodies are decompressed outside arrow-go: its
				// arrays alias the frame's contents, not pool buffers.
				t.Fatalf("nothing recycled: %+v", st)
			}
			if st.Idle > st.Max {
				t.Fatalf("idle %d beyond the cap %d", st.Idle, st.Max)
			}
		})
	}
}

// TestPoisonShowsEarlyRelease: the poison is visible to a row read after
// its release, so a release too early fails the tests that compare what
// was written.
func TestPoisonShowsEarlyRelease(t *testing.T) {
	enc, _ := NewEncoder(CodecLZ4)
	want := sample(1000)
	body, err := enc.Encode(nil, want)
	if err != nil {
		t.Fatal(err)
	}
	pool := NewBufferPool(8 << 20).Poisoned()
	rows, err := NewDecoderFor(FlowRows).WithPool(pool).Decode(make([]Row, 0, len(want)), body) // the caller's slice: not recycled
	if err != nil {
		t.Fatal(err)
	}
	bytesCol := FlowRows.ColumnIndex("bytes")
	before := rows[10].Int64(bytesCol)
	ReleaseRows(rows)
	after := rows[10].Int64(bytesCol) // the bug the release tests look for
	if before != want[10].Bytes || after == before {
		t.Fatalf("bytes %d before the release (want %d), %d after: the poison does not show", before, want[10].Bytes, after)
	}
}

// TestPooledDecodeErrors: a message that fails to decode (corrupt, over
// the limits) or has no rows leaves nothing held by the pool.
func TestPooledDecodeErrors(t *testing.T) {
	enc, _ := NewEncoder(CodecLZ4)
	good, err := enc.Encode(nil, sample(2000))
	if err != nil {
		t.Fatal(err)
	}
	empty, err := enc.Encode(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		body  []byte
		limit int
		want  error
	}{
		{"truncated", good[:len(good)*2/3], 1 << 20, ErrCorrupt},
		{"too many records", good, 100, ErrTooLarge},
		{"bit flip", flipByte(good, len(good)/2), 1 << 20, nil},
		{"no rows", empty, 1 << 20, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := NewBufferPool(8 << 20).Poisoned()
			lim, err := NewDecoderFor(FlowRows).Limited(16<<20, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := lim.WithPool(pool).Decode(nil, tc.body)
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if err == nil {
				ReleaseRows(rows)
			}
			if st := pool.Stats(); st.Messages != 0 || st.Out != 0 {
				t.Fatalf("pool holds %d messages (%d bytes) after %v", st.Messages, st.Out, err)
			}
		})
	}
}

func flipByte(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x5a
	return c
}

// TestPoolCap: buffers given back beyond the cap are dropped and
// counted, never kept.
func TestPoolCap(t *testing.T) {
	for _, capBytes := range []int64{0, 64 << 10, 1 << 20} {
		t.Run(fmt.Sprint(capBytes), func(t *testing.T) {
			p := NewBufferPool(capBytes)
			var bufs [][]byte
			for i := range 64 {
				bufs = append(bufs, p.get(4096+i*100))
			}
			p.put(bufs)
			st := p.Stats()
			if st.Idle > capBytes || st.Returned+st.Dropped != 64 {
				t.Fatalf("cap %d: %+v", capBytes, st)
			}
			if capBytes == 0 && st.Dropped != 64 {
				t.Fatalf("cap 0 kept buffers: %+v", st)
			}
		})
	}
}
