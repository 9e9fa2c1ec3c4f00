package schemas_test

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"
	"weak"

	"github.com/tapflow/tapflow/schemas"
)

// TestEncodeReusedScratch: an encoder keeps its column buffers, its IPC
// writer's builder and compressed scratch between messages; with
// messages of other sizes in between, every later message of every
// codec is byte for byte the first (fresh scratch) and decodes to the
// records, so none carries an earlier message's bytes.
func TestEncodeReusedScratch(t *testing.T) {
	recs := realistic(t)[:4096]
	for _, codec := range schemas.Codecs {
		t.Run(codec, func(t *testing.T) {
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
		})
	}
}

// TestIdleEncoderKeepsNoStrings: what an encoder keeps between messages
// (its arenas' dictionary values, maps and caches) holds no record's
// string once the message is written, so an idle agent does not keep an
// old attribution snapshot alive through it.
func TestIdleEncoderKeepsNoStrings(t *testing.T) {
	for _, codec := range []string{schemas.CodecLZ4, schemas.CodecNone} {
		t.Run(codec, func(t *testing.T) {
			enc, err := schemas.NewEncoder(codec)
			if err != nil {
				t.Fatal(err)
			}
			recs := slices.Clone(realistic(t)[:2000])
			held := make([]weak.Pointer[byte], len(recs))
			for i := range recs {
				// Own allocations (not tiny ones), one per record, in
				// a column past the dictionaries' scan size.
				recs[i].TenantID = strings.Clone(fmt.Sprintf("tenant-%016d", i))
				held[i] = weak.Make(unsafe.StringData(recs[i].TenantID))
			}
			if _, err := enc.Encode(nil, recs); err != nil {
				t.Fatal(err)
			}
			if enc.IdleArenas() != 1 {
				t.Fatalf("%d idle arenas, want the message's one kept", enc.IdleArenas())
			}
			recs = nil
			runtime.GC()
			runtime.GC()
			alive := 0
			for _, w := range held {
				if w.Value() != nil {
					alive++
				}
			}
			if alive > 0 {
				t.Fatalf("%d of %d records' strings still reachable after the message was written", alive, len(held))
			}
			runtime.KeepAlive(enc)
		})
	}
}
