package schemas_test

import (
	"sync"
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// TestEncoderArenasBounded: an encoder keeps at most two column arenas
// between messages however many messages encode at once, reuses its one
// arena when messages come one at a time, and every message decodes to
// its records (over ten times the cap through it at each concurrency).
func TestEncoderArenasBounded(t *testing.T) {
	recs := realistic(t)[:2048]
	for _, tc := range []struct {
		name        string
		concurrent  int
		messages    int // per goroutine
		wantIdleMax int
		wantIdleMin int
	}{
		{"one at a time", 1, 40, 1, 1},
		{"four at once", 4, 10, 2, 1},
		{"sixteen at once", 16, 5, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := schemas.NewEncoder(schemas.CodecLZ4)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, tc.concurrent)
			for g := range tc.concurrent {
				wg.Go(func() {
					part := recs[g*64 : g*64+1024]
					for range tc.messages {
						body, err := enc.Encode(nil, part)
						if err != nil {
							errs <- err
							return
						}
						got, err := schemas.NewDecoder().Decode(nil, body)
						if err != nil {
							errs <- err
							return
						}
						for i := range got {
							want := part[i]
							want.FillText()
							want.Bin = schemas.FlowBin{}
							if got[i] != want {
								t.Errorf("record %d differs after %s", i, tc.name)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if n := enc.IdleArenas(); n < tc.wantIdleMin || n > tc.wantIdleMax {
				t.Fatalf("%d idle arenas, want %d..%d", n, tc.wantIdleMin, tc.wantIdleMax)
			}
			enc.TakeArenas(20) // twenty messages at once come back to two
			if n := enc.IdleArenas(); n != 2 {
				t.Fatalf("after 20 concurrent messages: %d idle arenas, want 2", n)
			}
		})
	}
}
