//go:build linux

package source

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func mrec(ifname, dir string, start, end, packets, bytes int64) capture.MeterRecord {
	return capture.MeterRecord{TimeStart: start, TimeEnd: end, Ifname: ifname, Direction: dir, Packets: packets, Bytes: bytes,
		LostPackets: 1, LostBytes: 10, FailedUpdates: 2, SkippedNonIP: 3}
}

func summary(ms []schemas.Meter) []string {
	var out []string
	for _, m := range ms {
		out = append(out, strings.Join([]string{m.Node, m.Ifname, m.Direction}, "/")+
			" "+itoa(m.TimeStart)+"-"+itoa(m.TimeEnd)+" p="+itoa(m.Packets)+" b="+itoa(m.Bytes)+
			" lp="+itoa(m.LostPackets)+" lb="+itoa(m.LostBytes)+" fu="+itoa(m.FailedUpdates)+" sk="+itoa(m.SkippedNonIP))
	}
	slices.Sort(out)
	return out
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// TestMeterFeed drives the feed the way the runner does and checks what
// reaches the sink: deltas merged per tap and direction while they wait,
// failed batches merged back and retried, everything sent at shutdown.
func TestMeterFeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before: Adds before Run starts; fail: ack errors for the first
		// n batches; after: Adds once the first batch arrived.
		before [][]capture.MeterRecord
		fail   int
		after  [][]capture.MeterRecord
		want   []string // every record that reached the sink with a nil ack
	}{
		{
			name:   "one delta per tap and direction",
			before: [][]capture.MeterRecord{{mrec("tap1", "tx", 0, 10, 1, 100), mrec("tap1", "rx", 0, 10, 2, 200)}},
			want:   []string{"n/tap1/rx 0-10 p=2 b=200 lp=1 lb=10 fu=2 sk=3", "n/tap1/tx 0-10 p=1 b=100 lp=1 lb=10 fu=2 sk=3"},
		},
		{
			name: "waiting deltas merge",
			before: [][]capture.MeterRecord{
				{mrec("tap1", "tx", 0, 10, 1, 100)},
				{mrec("tap1", "tx", 10, 20, 4, 400), mrec("tap2", "tx", 10, 20, 5, 500)},
			},
			want: []string{"n/tap1/tx 0-20 p=5 b=500 lp=2 lb=20 fu=4 sk=6", "n/tap2/tx 10-20 p=5 b=500 lp=1 lb=10 fu=2 sk=3"},
		},
		{
			name:   "failed batch merged back with the next delta",
			before: [][]capture.MeterRecord{{mrec("tap1", "tx", 0, 10, 1, 100)}},
			fail:   1,
			after:  [][]capture.MeterRecord{{mrec("tap1", "tx", 10, 20, 2, 200)}},
			want:   []string{"n/tap1/tx 0-20 p=3 b=300 lp=2 lb=20 fu=4 sk=6"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			f, err := NewMeterFeed(MeterFeedOptions{Node: "n", Logger: slog.New(slog.DiscardHandler), Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			for _, ms := range tc.before {
				if err := f.Add(t.Context(), ms, func() {}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			out := make(chan *pipeline.BatchOf[schemas.Meter])
			done := make(chan error, 1)
			go func() { done <- f.Run(ctx, out); close(out) }()
			var got []schemas.Meter
			batches := 0
			for b := range out {
				batches++
				if batches <= tc.fail {
					b.Ack(errors.New("publish failed"))
				} else {
					got = append(got, b.Records...)
					b.Ack(nil)
				}
				if batches == 1 {
					for _, ms := range tc.after {
						_ = f.Add(t.Context(), ms, func() {})
					}
					// Let the retry (1s) and the new deltas meet, then stop.
					time.AfterFunc(1500*time.Millisecond, cancel)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if s := summary(got); !slices.Equal(s, tc.want) {
				t.Fatalf("sink got\n%s\nwant\n%s", strings.Join(s, "\n"), strings.Join(tc.want, "\n"))
			}
			if lost := testutil.ToFloat64(f.lost); lost != 0 {
				t.Errorf("lost %v records", lost)
			}
		})
	}
}

// TestMeterFeedLossCounted: a batch failed after Run returned cannot be
// retried; it is counted as lost, never silently dropped.
func TestMeterFeedLossCounted(t *testing.T) {
	f, err := NewMeterFeed(MeterFeedOptions{Node: "n", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Add(t.Context(), []capture.MeterRecord{mrec("tap1", "tx", 0, 10, 1, 100), mrec("tap1", "rx", 0, 10, 1, 100)}, func() {})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	out := make(chan *pipeline.BatchOf[schemas.Meter], 1)
	if err := f.Run(ctx, out); err != nil {
		t.Fatal(err)
	}
	b := <-out
	b.Ack(errors.New("hard stop"))
	if lost := testutil.ToFloat64(f.lost); lost != 2 {
		t.Fatalf("lost counter %v, want 2", lost)
	}
}

func TestMeterFeedNeedsNode(t *testing.T) {
	if _, err := NewMeterFeed(MeterFeedOptions{}); err == nil {
		t.Fatal("a feed without a node name was accepted")
	}
}
