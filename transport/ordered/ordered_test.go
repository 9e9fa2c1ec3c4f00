package ordered_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/ordered"
)

var quiet = slog.New(slog.DiscardHandler)

// publish stores n messages on the flows stream, bodies "0" … "n-1".
func publish(t *testing.T, s *transporttest.Server, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := s.JS.Publish(context.Background(), transport.FlowsSubject("cmp1"), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReaderSurvivesItsConsumer: whatever happens to the consumer in the
// reader's slot while it reads, the reader gets every message once, in
// order. Deleted (an operator, the server's inactivity timer): it is
// recreated under the same name after the last message handled. Taken
// over by another reader (a new consumer under the name, another claim):
// that one is left alone and the reader moves to a free slot.
func TestReaderSurvivesItsConsumer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		disturb  func(context.Context, jetstream.JetStream, string) error
		wantSlot string
	}{
		{"deleted", func(ctx context.Context, js jetstream.JetStream, name string) error {
			return js.DeleteConsumer(ctx, transport.FlowsStream, name)
		}, "u-0"},
		{"taken over", func(ctx context.Context, js jetstream.JetStream, name string) error {
			if err := js.DeleteConsumer(ctx, transport.FlowsStream, name); err != nil {
				return err
			}
			_, err := js.CreateConsumer(ctx, transport.FlowsStream, jetstream.ConsumerConfig{Name: name, Description: "another reader's claim",
				AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Hour})
			return err
		}, "u-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := transporttest.Run(t, "")
			publish(t, s, 0, 10)
			r, err := ordered.New(s.JS, ordered.Config{Stream: transport.FlowsStream, FilterSubject: transport.FlowsSubjectRoot + ".>",
				User: "u", Slots: 2, DeliverPolicy: jetstream.DeliverAllPolicy}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var got []string
			err = r.Run(ctx, func(m jetstream.Msg) error {
				got = append(got, string(m.Data()))
				switch len(got) {
				case 3:
					if err := tc.disturb(ctx, s.JS, r.Name()); err != nil {
						return err
					}
					publish(t, s, 10, 5) // while the consumer is gone
				case 15:
					return ordered.ErrStop
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := make([]string, 15)
			for i := range want {
				want[i] = strconv.Itoa(i)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("read %v, want %v", got, want)
			}
			if r.Resets() == 0 || r.Name() != tc.wantSlot {
				t.Fatalf("%d resets, slot %q; want a reset and slot %s", r.Resets(), r.Name(), tc.wantSlot)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.JS.Consumer(ctx, transport.FlowsStream, r.Name()); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Errorf("consumer %s after Close: %v, want deleted", r.Name(), err)
			}
			if tc.name == "taken over" {
				if _, err := s.JS.Consumer(ctx, transport.FlowsStream, "u-0"); err != nil {
					t.Errorf("the other reader's consumer u-0: %v, want it left alone", err)
				}
			}
		})
	}
}

// TestClaimsAreExclusive: readers of one user opening at the same moment
// each get a slot of their own; one more than the slots gets ErrNoSlot,
// and a slot is free again once its reader closes.
func TestClaimsAreExclusive(t *testing.T) {
	s := transporttest.Run(t, "")
	const slots = 4
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	readers := make([]*ordered.Reader, slots+1)
	errs := make([]error, len(readers))
	var wg sync.WaitGroup
	for i := range readers {
		r, err := ordered.New(s.JS, ordered.Config{Stream: transport.FlowsStream, User: "u", Slots: slots}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		readers[i] = r
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.Open(ctx) }()
	}
	wg.Wait()
	names, refused := map[string]bool{}, -1
	for i, err := range errs {
		switch {
		case errors.Is(err, ordered.ErrNoSlot):
			refused = i
		case err != nil:
			t.Fatalf("reader %d: %v", i, err)
		default:
			names[readers[i].Name()] = true
		}
	}
	if len(names) != slots || refused < 0 {
		t.Fatalf("slots %v, refused reader %d; want %d distinct slots and one refused", names, refused, slots)
	}
	held := readers[(refused+1)%len(readers)]
	freed := held.Name()
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if err := readers[refused].Open(ctx); err != nil || readers[refused].Name() != freed {
		t.Fatalf("after %s closed: slot %q, %v; want %s", freed, readers[refused].Name(), err, freed)
	}
}

// TestNewValidates: a bad configuration is refused before any contact,
// naming what to set.
func TestNewValidates(t *testing.T) {
	s := transporttest.Run(t, "")
	seq := ordered.Config{Stream: "S", User: "u", DeliverPolicy: jetstream.DeliverByStartSequencePolicy}
	for _, tc := range []struct {
		name string
		cfg  ordered.Config
		want string
	}{
		{"dotted stream", ordered.Config{Stream: "A.B", User: "u"}, "without dots"},
		{"no user", ordered.Config{Stream: "S"}, "give the NATS user"},
		{"wildcard user", ordered.Config{Stream: "S", User: "u.*"}, "give the NATS user"},
		{"too many slots", ordered.Config{Stream: "S", User: "u", Slots: 65}, "use 1..64"},
		{"start sequence 0", seq, "set the first stream sequence"},
		{"no start time", ordered.Config{Stream: "S", User: "u", DeliverPolicy: jetstream.DeliverByStartTimePolicy}, "set the time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ordered.New(s.JS, tc.cfg, quiet)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
