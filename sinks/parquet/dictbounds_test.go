package parquet

import (
	"fmt"
	"math/rand/v2"
	"testing"

	pq "github.com/parquet-go/parquet-go"
)

// TestBoundsDict: boundsDict's page bounds are parquet-go's own, Value
// for Value, on pages of every shape (one id, all ids, repeats, the
// empty string, prefixes of one another), across many pages of one
// dictionary and an epoch wrapping around.
func TestBoundsDict(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	words := []string{"", "a", "ab", "abc", "b", "ba", "zz", "z", "\xff", "\x00", "same_tenant", "external"}
	for i := range 300 {
		words = append(words, fmt.Sprintf("%x", rng.Uint64()>>(i%60)))
	}
	dict := pq.ByteArrayType.NewDictionary(0, 0, pq.ByteArrayType.NewValues(nil, nil))
	vals := make([]pq.Value, len(words))
	for i, w := range words {
		vals[i] = pq.ByteArrayValue([]byte(w))
	}
	ids := make([]int32, len(words))
	dict.Insert(ids, vals)
	fast := &boundsDict{Dictionary: dict}
	for _, tc := range []struct {
		name  string
		page  func() []int32
		epoch uint32
	}{
		{"one id", func() []int32 { return []int32{ids[rng.IntN(len(ids))]} }, 0},
		{"every id", func() []int32 { return append([]int32(nil), ids...) }, 0},
		{"repeats", func() []int32 {
			p := make([]int32, 1+rng.IntN(5000))
			for i := range p {
				p[i] = ids[rng.IntN(1+rng.IntN(len(ids)))]
			}
			return p
		}, 0},
		{"epoch wraps", func() []int32 {
			p := make([]int32, 1+rng.IntN(50))
			for i := range p {
				p[i] = ids[rng.IntN(len(ids))]
			}
			return p
		}, ^uint32(0) - 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.epoch != 0 {
				fast.epoch = tc.epoch
			}
			for range 200 {
				page := tc.page()
				wantMin, wantMax := dict.Bounds(page)
				gotMin, gotMax := fast.Bounds(page)
				if !pq.Equal(gotMin, wantMin) || !pq.Equal(gotMax, wantMax) || gotMin.Kind() != wantMin.Kind() || gotMin.Column() != wantMin.Column() || gotMax.Column() != wantMax.Column() {
					t.Fatalf("page of %d ids: bounds %q..%q, want %q..%q", len(page), gotMin.ByteArray(), gotMax.ByteArray(), wantMin.ByteArray(), wantMax.ByteArray())
				}
			}
		})
	}
}
