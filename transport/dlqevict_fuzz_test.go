package transport_test

import (
	"encoding/json"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/tapflow/tapflow/transport"
)

// FuzzDLQEvictions: an eviction tally body as collectors and `tapflow dlq
// inspect` read it from the DLQ stream (whatever was published on the
// tally subject). Decoding never panics; what decodes survives a
// re-encode unchanged (collectors rewrite the tally); adding it to a tally
// never lowers a count, even near the top of uint64 (saturating, no wrap
// that would hide evictions).
func FuzzDLQEvictions(f *testing.F) {
	base := transport.DLQEvictions{Sender: "cmp1", Stream: transport.FlowsStream, Letters: 3, Bytes: 3000, Records: 30,
		ByReason: map[string]uint64{"time": 2, "identity": 1}, First: time.Unix(1700000000, 0).UTC(), Last: time.Unix(1700000100, 0).UTC(), LastMsgID: "cmp1-9"}
	seed, err := json.Marshal(base)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"letters":18446744073709551615,"bytes":18446744073709551615,"by_reason":{"time":18446744073709551615}}`))
	f.Add([]byte(`{"first":"2026-01-01T00:00:00+01:00","last":"0001-01-01T00:00:00Z","by_reason":null}`))
	f.Add([]byte(`{"letters":-1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := transport.DecodeDLQEvictions(body)
		if err != nil {
			return
		}
		again, err := json.Marshal(e)
		if err != nil {
			return // a time outside RFC 3339's years: not re-encodable, refused by Marshal
		}
		r, err := transport.DecodeDLQEvictions(again)
		if err != nil {
			t.Fatalf("re-encoded tally does not decode: %v\n%s", err, again)
		}
		if r.Sender != e.Sender || r.Stream != e.Stream || r.Letters != e.Letters || r.Bytes != e.Bytes || r.Records != e.Records ||
			r.LastMsgID != e.LastMsgID || !r.First.Equal(e.First) || !r.Last.Equal(e.Last) || !maps.Equal(r.ByReason, e.ByReason) {
			t.Fatalf("re-encode changed the tally:\n%+v\n%+v", e, r)
		}
		sum := base
		sum.ByReason = maps.Clone(base.ByReason)
		sum.Add(e)
		for _, c := range [][3]uint64{{sum.Letters, base.Letters, e.Letters}, {sum.Bytes, base.Bytes, e.Bytes}, {sum.Records, base.Records, e.Records}} {
			if c[0] < c[1] || c[0] < c[2] || c[0] != c[1]+c[2] && c[0] != math.MaxUint64 {
				t.Fatalf("sum %d of %d and %d", c[0], c[1], c[2])
			}
		}
		for k, n := range e.ByReason {
			if sum.ByReason[k] < n || sum.ByReason[k] < base.ByReason[k] {
				t.Fatalf("by_reason[%q]: sum %d of %d and %d", k, sum.ByReason[k], base.ByReason[k], n)
			}
		}
	})
}
