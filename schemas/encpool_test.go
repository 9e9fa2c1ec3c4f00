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
// after it went back and none carries an earlier message's bytes. Over
// ten times the pool's cap goes through it; it keeps no more than its
// cap idle and holds nothing once the messages are written.
func TestEncodeRecycledBuffers(t *testing.T) {
	recs := realistic(t)[:4096]
	for _, codec := range schemas.Codecs {
		t.Run(codec, func(t *testing.T) {
			const poolCap = 256 << 10
			pool := schemas.NewBufferPool(poolCap).Poisoned()
			t.Cleanup(schemas.SetEncodePool(pool))
			enc, err := schemas.NewEncoder(codec)
			if err != nil {
				t.Fatal(err)
			}
			var first []byte
			for i := range 16 {
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
			st := pool.Stats()
			// Buffer compression (lz4, arrow-zstd) allocates each buffer's
			// worst case; zstd compresses the plain stream afterwards.
			buffers := codec == schemas.CodecLZ4 || codec == schemas.CodecArrowZstd
			if buffers && (st.Hits == 0 || st.Bytes < 10*poolCap) {
				t.Fatalf("want buffers recycled and over ten times the cap through the pool: %+v", st)
			}
			if st.Idle > poolCap || st.Out != 0 || st.Messages != 0 {
				t.Fatalf("idle above the cap, or buffers still held after every message was written: %+v", st)
			}
		})
	}
}
