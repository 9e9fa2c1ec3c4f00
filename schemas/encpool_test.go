package schemas_test

import (
	"bytes"
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// TestEncodeRecycledBuffers: the encoder's IPC buffers come from a pool
// and go back to it after each message; with a pool that poisons what it
// takes back, every later message of every codec is byte for byte the
// first (fresh buffers) and decodes to the records, so no buffer is read
// after it went back and none carries an earlier message's bytes.
func TestEncodeRecycledBuffers(t *testing.T) {
	recs := realistic(t)[:4096]
	for _, codec := range schemas.Codecs {
		t.Run(codec, func(t *testing.T) {
			pool := schemas.NewBufferPool(64 << 20).Poisoned()
			t.Cleanup(schemas.SetEncodePool(pool))
			enc, err := schemas.NewEncoder(codec)
			if err != nil {
				t.Fatal(err)
			}
			var first []byte
			for i := range 4 {
				// Other sizes in between, so buffers change hands.
				n := len(recs) >> (i % 3)
				if _, err := enc.Encode(nil, recs[:n/2+1]); err != nil {
					t.Fatal(err)
				}
				out, err := enc.Encode(nil, recs)
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = out
					continue
				}
				if !bytes.Equal(out, first) {
					t.Fatalf("message %d differs from the first (%d vs %d bytes)", i, len(out), len(first))
				}
			}
			got, err := schemas.NewDecoder().Decode(nil, first)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(recs) {
				t.Fatalf("decoded %d records, want %d", len(got), len(recs))
			}
			if st := pool.Stats(); codec != schemas.CodecNone && st.Hits == 0 {
				t.Fatalf("no buffer was recycled: %+v", st)
			}
		})
	}
}
