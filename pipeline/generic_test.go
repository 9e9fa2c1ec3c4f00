package pipeline

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

// meterish is a record type other than schemas.Flow.
type meterish struct{ n int }

type sliceSource[T any] struct{ batches [][]T }

func (s sliceSource[T]) Name() string { return "slice" }
func (s sliceSource[T]) Run(_ context.Context, out chan<- *BatchOf[T]) error {
	for _, b := range s.batches {
		out <- NewBatchOf(b, nil)
	}
	return nil
}

// holdLast keeps the last record of every batch until Flush.
type holdLast struct{ held []meterish }

func (h *holdLast) Name() string { return "hold" }
func (h *holdLast) Apply(_ context.Context, b *BatchOf[meterish]) error {
	if n := len(b.Records); n > 0 {
		h.held = append(h.held, b.Records[n-1])
		b.Records = b.Records[:n-1]
	}
	return nil
}
func (h *holdLast) Flush() []meterish { return h.held }

type collect[T any] struct {
	mu  sync.Mutex
	got []T
}

func (c *collect[T]) Name() string { return "collect" }
func (c *collect[T]) Run(_ context.Context, in <-chan *BatchOf[T]) error {
	for b := range in {
		c.mu.Lock()
		c.got = append(c.got, b.Records...)
		c.mu.Unlock()
		b.Ack(nil)
	}
	return nil
}

// TestRunnerOfOtherType runs a chain of a non-flow record type, with a
// holding transform, on metrics shared with a flow pipeline.
func TestRunnerOfOtherType(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batches [][]meterish
		want    []int
	}{
		{"empty", nil, nil},
		{"one", [][]meterish{{{1}}}, []int{1}},
		{"held flushed last", [][]meterish{{{1}, {2}}, {{3}, {4}, {5}}}, []int{1, 3, 4, 2, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(nil)
			sink := &collect[meterish]{}
			r, err := NewRunnerOf(Config{Name: "meters"}, SourceOf[meterish](sliceSource[meterish]{tc.batches}),
				[]TransformOf[meterish]{&holdLast{}}, SinkOf[meterish](sink), m, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // the source returns by itself; a soft stop must still drain
			if err := r.Run(ctx); err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, v := range sink.got {
				got = append(got, v.n)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("sink got %v, want %v", got, tc.want)
			}
		})
	}
}
