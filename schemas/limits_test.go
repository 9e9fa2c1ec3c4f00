package schemas

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestLimitedDecoder: a limited decoder refuses bombs and oversized
// batches with ErrTooLarge, and accepts what fits.
func TestLimitedDecoder(t *testing.T) {
	const limit = 1 << 20
	empty := make([]Flow, 100_000) // 14 MB as plain Arrow IPC
	encode := func(codec string, recs []Flow) []byte {
		e, err := NewEncoder(codec)
		if err != nil {
			t.Fatal(err)
		}
		body, err := e.Encode(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	for _, tc := range []struct {
		name       string
		body       []byte
		maxRecords int
		want       error // nil: decodes
		records    int
	}{
		{"zstd bomb: empty rows over the byte cap", encode(CodecZstd, empty), 1 << 20, ErrTooLarge, 0},
		{"lz4 buffers expand over the byte cap", encode(CodecLZ4, empty), 1 << 20, ErrTooLarge, 0},
		{"arrow-zstd buffers expand over the byte cap", encode(CodecArrowZstd, empty), 1 << 20, ErrTooLarge, 0},
		{"plain body over the byte cap", encode(CodecNone, empty), 1 << 20, ErrTooLarge, 0},
		{"zstd: more records than max_records", encode(CodecZstd, sample(2000)), 1999, ErrTooLarge, 0},
		{"plain: more records than max_records", encode(CodecNone, sample(2000)), 1000, ErrTooLarge, 0},
		{"exactly max_records", encode(CodecZstd, sample(2000)), 2000, nil, 2000},
		{"lz4 within limits", encode(CodecLZ4, sample(3000)), 1 << 20, nil, 3000},
		{"corrupt stays corrupt", []byte("not arrow"), 1 << 20, ErrCorrupt, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDecoder().Limited(limit, tc.maxRecords)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Decode(nil, tc.body)
			if tc.want == nil {
				if err != nil || len(got) != tc.records {
					t.Fatalf("got %d records, %v; want %d", len(got), err, tc.records)
				}
				return
			}
			if !errors.Is(err, tc.want) || len(got) != 0 {
				t.Fatalf("got %d records, err %v; want %v", len(got), err, tc.want)
			}
			if tc.want == ErrTooLarge && errors.Is(err, ErrCorrupt) {
				t.Fatalf("size error also marked corrupt: %v", err)
			}
		})
	}
}

// TestLimitedDecoderBoundsMemory: decoding a zstd bomb of a few KB that
// decompresses to 14 MB allocates about the cap, not the decompressed
// size — with the frame's content size declared (refused from the header)
// and without it (a streamed frame: refused while decompressing). The
// unlimited decoder on the same bodies shows the test can fail.
func TestLimitedDecoderBoundsMemory(t *testing.T) {
	plain, err := mustEncoder(t, CodecNone).Encode(nil, make([]Flow, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	declared, err := mustEncoder(t, CodecZstd).Encode(nil, make([]Flow, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	var streamed bytes.Buffer
	zw, _ := zstd.NewWriter(&streamed)
	_, _ = zw.Write(plain)
	_ = zw.Close()
	const limit = 1 << 20
	d, err := NewDecoder().Limited(limit, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"declared size": declared, "streamed": streamed.Bytes()} {
		limited, lerr := allocated(d, body)
		unlimited, uerr := allocated(NewDecoder(), body)
		t.Logf("%s: body %d bytes (%d decompressed): limited decoder allocated %d bytes (%v), unlimited %d (%v)",
			name, len(body), len(plain), limited, lerr, unlimited, uerr)
		if !errors.Is(lerr, ErrTooLarge) || limited > 3*limit {
			t.Errorf("%s: limited decoder allocated %d bytes for a %d-byte cap, err %v", name, limited, limit, lerr)
		}
		if uerr != nil || unlimited < 10*limit {
			t.Errorf("%s: unlimited decoder allocated only %d bytes (%v): the bomb is not a bomb", name, unlimited, uerr)
		}
	}
}

func mustEncoder(t *testing.T, codec string) *Encoder {
	e, err := NewEncoder(codec)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func allocated(d *Decoder, body []byte) (uint64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := d.Decode(nil, body)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}

func TestLimitedRejectsBadLimits(t *testing.T) {
	for _, l := range [][2]int64{{0, 1}, {1 << 20, 0}, {maxDecodedBody + 1, 1}} {
		if _, err := NewDecoder().Limited(l[0], int(l[1])); err == nil {
			t.Errorf("Limited(%d, %d) accepted", l[0], l[1])
		}
	}
}
