package transport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// serverKind is a nats-server tapflow supports: the version it links
// (embedded) and Debian 12's package (2.9.10, the oldest supported).
type serverKind struct {
	name string
	// inPlace: the server changes a stream's retention in place (2.10+).
	inPlace bool
	start   func(t *testing.T) jetstream.JetStream
}

var serverKinds = []serverKind{
	{name: "linked", inPlace: true, start: func(t *testing.T) jetstream.JetStream {
		return transporttest.Listen(t, "", "127.0.0.1:0").JS
	}},
	{name: "debian-2.9", start: func(t *testing.T) jetstream.JetStream {
		bin, v := chaos.DebianNATS(t)
		if !strings.HasPrefix(v, "2.9.") {
			t.Fatalf("%s is %s, want Debian 12's 2.9.x", bin, v)
		}
		dir := t.TempDir()
		n, err := chaos.NewStockNATS(bin, filepath.Join(dir, "store"), filepath.Join(dir, "nats.log"))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		cfg := transport.DefaultConfig()
		cfg.URL = "nats://" + n.Addr()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// transport.Connect checks the version: 2.9.10 must pass.
		nc, err := transport.Connect(ctx, cfg, "test", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}},
}

// TestStreamSetupNoDropConcurrent: on an empty server an agent
// (EnsureStreamsKeepConsumers) and a collector (EnsureStreams) set the
// streams up at the same time while a publisher publishes from the first
// moment; every publish the server acknowledged is in the stream for the
// collector. A stream created with interest retention before its consumer
// exists would acknowledge and drop them.
func TestStreamSetupNoDropConcurrent(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			js := k.start(t)
			// Three rounds on a fresh pair of streams: the window a wrong
			// order would open is one round trip, hit in most rounds.
			for round := range 3 {
				setupRound(t, js, round)
			}
		})
	}
}

func setupRound(t *testing.T, js jetstream.JetStream, round int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	subjects := map[string]string{transport.FlowsStream: transport.FlowsSubject("n1"), transport.MetersStream: transport.MetersSubject("n1")}
	for stream := range subjects {
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatal(err)
		}
	}
	acked := map[string]*atomic.Int64{transport.FlowsStream: {}, transport.MetersStream: {}}
	stop := make(chan struct{})
	var pubs sync.WaitGroup
	// Several publishers per stream, so the window between a stream's
	// creation and its consumer's is hit.
	for j := range 8 {
		for stream, subj := range subjects {
			pubs.Add(1)
			go func() {
				defer pubs.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					pctx, pcancel := context.WithTimeout(ctx, time.Second)
					_, err := js.Publish(pctx, subj, []byte("x"), jetstream.WithMsgID(fmt.Sprintf("%s-%d-%d-%d", subj, round, j, i)))
					pcancel()
					if err == nil {
						acked[stream].Add(1)
					} else {
						time.Sleep(100 * time.Microsecond) // no stream for the subject yet
					}
				}
			}()
		}
	}
	var setup sync.WaitGroup
	errs := make([]error, 2)
	for i, ensure := range []func(context.Context, jetstream.JetStream, transport.Config, *slog.Logger) error{transport.EnsureStreamsKeepConsumers, transport.EnsureStreams} {
		setup.Add(1)
		go func() { defer setup.Done(); errs[i] = ensure(ctx, js, transport.DefaultConfig(), log) }()
	}
	setup.Wait()
	if err := errors.Join(errs...); err != nil {
		close(stop)
		pubs.Wait()
		t.Fatal(err)
	}
	// Keep publishing a little after the setup.
	for _, a := range acked {
		for base := a.Load(); a.Load() < base+50; {
			time.Sleep(5 * time.Millisecond)
		}
	}
	close(stop)
	pubs.Wait()
	for stream := range subjects {
		info := streamInfo(t, js, stream)
		if info.Config.Retention != jetstream.InterestPolicy || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != strings.TrimSuffix(subjects[stream], "n1")+">" {
			t.Errorf("round %d: %s: retention %s subjects %v", round, stream, info.Config.Retention, info.Config.Subjects)
		}
		if got, want := info.State.Msgs, uint64(acked[stream].Load()); got != want {
			t.Errorf("round %d: %s holds %d messages, the server acknowledged %d publishes: %d dropped", round, stream, got, want, int64(want)-int64(got))
		}
	}
}

// TestStreamSetupWindow: a publish in the moment between a stream's
// creation and its consumer's is refused (the agent retries or spools
// it), never acknowledged and dropped.
func TestStreamSetupWindow(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			js := k.start(t)
			subjects := map[string]string{transport.FlowsStream: transport.FlowsSubject("n1"), transport.MetersStream: transport.MetersSubject("n1")}
			acked := map[string]bool{}
			transport.SetAfterCreate(func(stream string) {
				subj, ok := subjects[stream]
				if !ok {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err := js.Publish(ctx, subj, []byte("in the window"))
				acked[stream] = err == nil
			})
			defer transport.SetAfterCreate(nil)
			if err := transport.EnsureStreams(context.Background(), js, transport.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			for stream := range subjects {
				if _, ran := acked[stream]; !ran {
					t.Fatalf("%s: the hook never ran", stream)
				}
				if got := streamInfo(t, js, stream).State.Msgs; acked[stream] && got != 1 {
					t.Errorf("%s: a publish in the setup window was acknowledged and dropped (stream holds %d)", stream, got)
				} else if acked[stream] {
					t.Errorf("%s: a publish was acknowledged before the consumer existed (kept only by luck of retention)", stream)
				}
			}
		})
	}
}

// TestLegacyLimitsStream: a stream an older tapflow created with limits
// retention (and the collector consumer it created) holding messages the
// collector has not acked. A server that changes retention in place gets
// it migrated, nothing lost; 2.9 gets a fast error naming the messages at
// stake and the fix, the stream untouched. Once every message is acked,
// 2.9 gets the stream recreated with interest retention.
func TestLegacyLimitsStream(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			js := k.start(t)
			ctx := context.Background()
			cfg := transport.DefaultConfig()
			sc := transport.StreamConfigs(cfg)[0]
			sc.Retention = jetstream.LimitsPolicy
			if _, err := js.CreateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, sc.Name, *transport.CollectorConsumerConfigs(cfg.Collector)[sc.Name])
			if err != nil {
				t.Fatal(err)
			}
			publishN(t, js, transport.FlowsSubject("n1"), 10, 100)
			held := fetchHold(t, cons, 10, 4) // 4 acked, 6 held
			var logs syncBuf
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ectx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err = transport.EnsureStreams(ectx, js, cfg, log)
			retried := ectx.Err() != nil
			cancel()
			info := streamInfo(t, js, sc.Name)
			if k.inPlace {
				if err != nil || info.Config.Retention != jetstream.InterestPolicy || info.State.Msgs != 6 {
					t.Fatalf("in-place migration: err %v, retention %s, %d messages (want interest, the 6 unacked)", err, info.Config.Retention, info.State.Msgs)
				}
				return
			}
			if err == nil || retried {
				t.Fatalf("EnsureStreams on 2.9 with an unacked limits stream: err %v (want a fast permanent error)", err)
			}
			for _, w := range []string{"TAPFLOW_FLOWS", "limits retention", "10 messages", "6 of them not yet acked", "upgrade nats-server to 2.10", "nats stream rm -f TAPFLOW_FLOWS", "nats stream backup TAPFLOW_FLOWS"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if info.Config.Retention != jetstream.LimitsPolicy || info.State.Msgs != 10 || info.Config.Subjects[0] != sc.Subjects[0] {
				t.Fatalf("refused stream changed: retention %s, %d messages, subjects %v", info.Config.Retention, info.State.Msgs, info.Config.Subjects)
			}
			// The collector catches up (acks the 6 it holds): nothing left to
			// lose, so the stream is recreated.
			for _, m := range held {
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := transport.EnsureStreams(ctx, js, cfg, log); err != nil {
				t.Fatalf("EnsureStreams once every message is acked: %v", err)
			}
			info = streamInfo(t, js, sc.Name)
			if info.Config.Retention != jetstream.InterestPolicy || info.State.Msgs != 0 || info.Config.Subjects[0] != sc.Subjects[0] {
				t.Fatalf("after recreation: retention %s, %d messages, subjects %v", info.Config.Retention, info.State.Msgs, info.Config.Subjects)
			}
			if _, err := js.Consumer(ctx, sc.Name, transport.DefaultDurable); err != nil {
				t.Fatalf("recreated stream lacks the collector consumer: %v", err)
			}
			if !strings.Contains(logs.String(), "stream recreated with interest retention") {
				t.Errorf("no recreation line in the log:\n%s", logs.String())
			}
			publishN(t, js, transport.FlowsSubject("n2"), 3, 10)
			if got := streamInfo(t, js, sc.Name).State.Msgs; got != 3 {
				t.Fatalf("recreated stream kept %d of 3 publishes", got)
			}
		})
	}
}

// fetchHold fetches n messages from cons, acks the first ack of them and
// returns the others unacked.
func fetchHold(t *testing.T, cons jetstream.Consumer, n, ack int) []jetstream.Msg {
	t.Helper()
	var msgs []jetstream.Msg
	for len(msgs) < n {
		batch, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			msgs = append(msgs, msg)
		}
		if got == 0 {
			t.Fatalf("fetched %d of %d messages", len(msgs), n)
		}
	}
	for _, m := range msgs[:ack] {
		if err := m.DoubleAck(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return msgs[ack:]
}

// TestTermLeavesStream: a message the collector dead-letters is
// terminated and leaves the interest stream on every server; 2.9 ignores
// a +TERM with a reason, so transport.Term sends a bare one there.
func TestTermLeavesStream(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			js := k.start(t)
			ctx := context.Background()
			if err := transport.EnsureStreams(ctx, js, transport.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			publishN(t, js, transport.FlowsSubject("n1"), 1, 10)
			cons, err := js.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := transport.Term(js.Conn(), msg, "tapflow: rejected (test): bad"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "terminated message leaves the stream", 10*time.Second, func() bool {
				return streamInfo(t, js, transport.FlowsStream).State.Msgs == 0
			})
		})
	}
}
