package source

import (
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// TestFlowArrays: an acked batch's array comes back for the next batch
// that fits in it, a smaller one is replaced, and the free list keeps at
// most freeFlowArrays arrays.
func TestFlowArrays(t *testing.T) {
	cases := []struct {
		name      string
		put, want int // capacity given back, then records asked for
		reused    bool
	}{
		{"same size", 16384, 16384, true},
		{"smaller batch", 16384, 100, true},
		{"larger batch", 100, 16384, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFlowArrays()
			a := make([]schemas.Flow, c.put)
			p.put(a)
			b := p.get(c.want)
			if len(b) != c.want {
				t.Fatalf("len %d, want %d", len(b), c.want)
			}
			if reused := &b[0] == &a[:1][0]; reused != c.reused {
				t.Fatalf("reused %v, want %v", reused, c.reused)
			}
		})
	}
	p := newFlowArrays()
	for range freeFlowArrays + 3 {
		p.put(make([]schemas.Flow, 1))
	}
	if n := len(p.free); n != freeFlowArrays {
		t.Fatalf("%d arrays kept, want %d", n, freeFlowArrays)
	}
}
