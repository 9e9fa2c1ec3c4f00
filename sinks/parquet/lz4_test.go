package parquet

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/parquet-go/parquet-go/compress/lz4"
)

// TestLZ4RawRoundTrip: the pooled LZ4_RAW codec's blocks decode with
// parquet-go's own LZ4_RAW decoder (what readers of the files run), for
// empty, incompressible and repetitive pages, reusing dst.
func TestLZ4RawRoundTrip(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 300<<10)
	for i := range random {
		random[i] = byte(rnd.Uint32())
	}
	repetitive := bytes.Repeat([]byte("fa:16:3e:00:00:01 10.0.0.1 tenant-a "), 8000)
	var dst []byte
	for _, tc := range []struct {
		name string
		src  []byte
	}{
		{"empty", nil},
		{"one byte", []byte{7}},
		{"incompressible", random},
		{"repetitive", repetitive},
		{"after a larger page", repetitive[:100]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if dst, err = lz4RawCodec.Encode(dst, tc.src); err != nil {
				t.Fatal(err)
			}
			got, err := (&lz4.Codec{}).Decode(nil, dst)
			if err != nil {
				t.Fatalf("decode %d bytes: %v", len(dst), err)
			}
			if !bytes.Equal(got, tc.src) {
				t.Fatalf("round trip of %d bytes gave %d bytes, not the same", len(tc.src), len(got))
			}
			if len(tc.src) == len(repetitive) && len(dst) > len(tc.src)/10 {
				t.Errorf("repetitive page compressed to %d of %d bytes; want ≤ 10%%", len(dst), len(tc.src))
			}
		})
	}
}
