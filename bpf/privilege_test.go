//go:build linux

package bpf

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// The capability names of a refused load; the missing-capability branch
// runs in internal/testkit/install (the installed agent under setpriv
// without each capability), as a Go test cannot drop capabilities for
// all its threads.
func TestPermissionErrorWithAllCaps(t *testing.T) {
	prereq.Root(t, "the branch where every capability is held")
	if miss := MissingCaps(); miss != nil {
		t.Fatalf("MissingCaps as root = %q, want none", miss)
	}
	msg := permissionError(unix.EPERM).Error()
	for _, want := range []string{"although CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN are held", "SystemCallFilter=", "operation not permitted"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
}
