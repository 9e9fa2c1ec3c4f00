package transport_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// TestEnsureStreams runs EnsureStreams a second time on a real embedded
// server (transporttest ran it once) and checks every stream and its subjects.
func TestEnsureStreams(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	if err := transport.EnsureStreams(ctx, s.JS, transport.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("second EnsureStreams: %v", err)
	}
	for _, tc := range []struct {
		stream, subject string
		maxBytes        int64
	}{
		{transport.FlowsStream, transport.FlowsSubject("cmp-1"), int64(transport.DefaultConfig().StreamMaxBytes)},
		{transport.MetersStream, transport.MetersSubject("cmp-1"), transport.MetersMaxBytes},
		{transport.DLQStream, transport.DLQSubject(transport.DLQMetersSubject, transport.MetersSubject("cmp-1")), 1 << 30},
		{transport.DLQStream, transport.DLQEvictedSubject(transport.DLQFlowsSubject, "cmp-1"), 1 << 30},
		{transport.DLQStream, transport.DLQFlowsSubject, 1 << 30},
	} {
		t.Run(tc.stream+"/"+tc.subject, func(t *testing.T) {
			st, err := s.JS.Stream(ctx, tc.stream)
			if err != nil {
				t.Fatalf("stream %s: %v", tc.stream, err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.Config.MaxBytes != tc.maxBytes {
				t.Errorf("max bytes %d, want %d", info.Config.MaxBytes, tc.maxBytes)
			}
			name, err := s.JS.StreamNameBySubject(ctx, tc.subject)
			if err != nil || name != tc.stream {
				t.Errorf("subject %s is in stream %q (%v), want %s", tc.subject, name, err, tc.stream)
			}
			if tc.stream != transport.DLQStream && !slices.Contains(info.Config.Subjects, tc.subject[:len(tc.subject)-len("cmp-1")]+">") {
				t.Errorf("subjects %v", info.Config.Subjects)
			}
		})
	}
}

// TestListenPortZero: two embedded servers asked for port 0 both start, on
// different free ports (nats-server alone would put both on 4222).
func TestListenPortZero(t *testing.T) {
	a, b := transporttest.Run(t, ""), transporttest.Run(t, "")
	if a.ClientURL() == "" || a.ClientURL() == b.ClientURL() {
		t.Fatalf("client URLs %q and %q: want two different listening ports", a.ClientURL(), b.ClientURL())
	}
}

// TestReplicasOnSingleServerFailsFast: R3 on a non-clustered server is a
// configuration error reported at once with the fix, not retried forever.
func TestReplicasOnSingleServerFailsFast(t *testing.T) {
	s := transporttest.Run(t, "")
	cfg := transport.DefaultConfig()
	cfg.Replicas = 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := transport.EnsureStreams(ctx, s.JS, cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("EnsureStreams with 3 replicas on one server succeeded")
	}
	if ctx.Err() != nil {
		t.Fatalf("EnsureStreams retried until the deadline instead of failing fast: %v", err)
	}
	for _, want := range []string{"nats.replicas", "not a JetStream cluster"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestValidateReplicas(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		url      string
		ok       bool
	}{
		{1, "", true}, {3, "nats://a:4222,nats://b:4222,nats://c:4222", true}, {5, "nats://a:4222", true},
		{0, "", false}, {2, "nats://a:4222", false}, {3, "", false}, {7, "nats://a:4222", false},
	} {
		cfg := transport.DefaultConfig()
		cfg.Replicas, cfg.URL = tc.replicas, tc.url
		err := cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("replicas %d url %q: err %v, want ok=%v", tc.replicas, tc.url, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "replicas") {
			t.Errorf("replicas %d: error %q does not name the key", tc.replicas, err)
		}
	}
}
