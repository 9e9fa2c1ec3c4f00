package transport_test

import (
	"testing"

	"github.com/tapflow/tapflow/transport"
)

// TestDLQSubject: a dead letter's subject names the sender the publish
// permissions bind (the token after the flows or meters root), whatever
// else the subject carries.
func TestDLQSubject(t *testing.T) {
	for _, tc := range []struct {
		prefix, orig, sender, subject, evicted string
	}{
		{transport.DLQFlowsSubject, "tapflow.flows.v1.cmp7", "cmp7", "tapflow.dlq.flows.cmp7", "tapflow.dlq.evicted.flows.cmp7"},
		{transport.DLQMetersSubject, "tapflow.meters.v1.cmp-7_a", "cmp-7_a", "tapflow.dlq.meters.cmp-7_a", "tapflow.dlq.evicted.meters.cmp-7_a"},
		{transport.DLQFlowsSubject, "tapflow.flows.v1.cmp7.extra.tokens", "cmp7", "tapflow.dlq.flows.cmp7", "tapflow.dlq.evicted.flows.cmp7"},
		{transport.DLQFlowsSubject, "tapflow.flows.v1", "_other", "tapflow.dlq.flows._other", "tapflow.dlq.evicted.flows._other"},
		{transport.DLQFlowsSubject, "somewhere.else", "_other", "tapflow.dlq.flows._other", "tapflow.dlq.evicted.flows._other"},
	} {
		if got := transport.DLQSender(tc.orig); got != tc.sender {
			t.Errorf("DLQSender(%q) = %q, want %q", tc.orig, got, tc.sender)
		}
		if got := transport.DLQSubject(tc.prefix, tc.orig); got != tc.subject {
			t.Errorf("DLQSubject(%q, %q) = %q, want %q", tc.prefix, tc.orig, got, tc.subject)
		}
		if got := transport.DLQEvictedSubject(tc.prefix, tc.sender); got != tc.evicted {
			t.Errorf("DLQEvictedSubject(%q, %q) = %q, want %q", tc.prefix, tc.sender, got, tc.evicted)
		}
	}
}
