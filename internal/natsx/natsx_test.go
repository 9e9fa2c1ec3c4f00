package natsx_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/tapflow/tapflow/internal/natsx"
	"github.com/tapflow/tapflow/internal/natsx/natsxtest"
)

// TestEnsureStreams runs EnsureStreams a second time on a real embedded
// server (natsxtest ran it once) and checks every stream and its subjects.
func TestEnsureStreams(t *testing.T) {
	s := natsxtest.Run(t, "")
	ctx := context.Background()
	if err := natsx.EnsureStreams(ctx, s.JS, natsx.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("second EnsureStreams: %v", err)
	}
	for _, tc := range []struct {
		stream, subject string
		maxBytes        int64
	}{
		{natsx.FlowsStream, natsx.FlowsSubject("cmp-1"), int64(natsx.DefaultConfig().StreamMaxBytes)},
		{natsx.MetersStream, natsx.MetersSubject("cmp-1"), natsx.MetersMaxBytes},
		{natsx.DLQStream, natsx.DLQMetersSubject, 1 << 30},
		{natsx.DLQStream, natsx.DLQFlowsSubject, 1 << 30},
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
			if tc.stream != natsx.DLQStream && !slices.Contains(info.Config.Subjects, tc.subject[:len(tc.subject)-len("cmp-1")]+">") {
				t.Errorf("subjects %v", info.Config.Subjects)
			}
		})
	}
}

// TestListenPortZero: two embedded servers asked for port 0 both start, on
// different free ports (nats-server alone would put both on 4222).
func TestListenPortZero(t *testing.T) {
	a, b := natsxtest.Run(t, ""), natsxtest.Run(t, "")
	if a.ClientURL() == "" || a.ClientURL() == b.ClientURL() {
		t.Fatalf("client URLs %q and %q: want two different listening ports", a.ClientURL(), b.ClientURL())
	}
}
