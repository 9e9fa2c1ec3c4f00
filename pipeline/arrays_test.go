package pipeline

import (
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// TestArrays: an acked batch's array comes back for the next batch that
// fits in it, a smaller one is replaced, and the free list keeps at most
// its bound.
func TestArrays(t *testing.T) {
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
			p := NewArrays[schemas.Flow](FreeArrays)
			a := make([]schemas.Flow, c.put)
			p.Put(a)
			b := p.Get(c.want)
			if len(b) != c.want {
				t.Fatalf("len %d, want %d", len(b), c.want)
			}
			if reused := &b[0] == &a[:1][0]; reused != c.reused {
				t.Fatalf("reused %v, want %v", reused, c.reused)
			}
		})
	}
	p := NewArrays[schemas.Flow](FreeArrays)
	for range FreeArrays + 3 {
		p.Put(make([]schemas.Flow, 1))
	}
	if n := p.Idle(); n != FreeArrays {
		t.Fatalf("%d arrays kept, want %d", n, FreeArrays)
	}
}
