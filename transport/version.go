package transport

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MinServerVersion is the oldest nats-server tapflow supports: Debian 12's
// package (2.9.10), the oldest version the delivery chaos test runs
// against in make test. Everything tapflow asks of JetStream exists there
// (interest streams, durable pull consumers with one filter subject,
// direct gets, object store); what does not (changing a stream's
// retention in place, a reason with +TERM, several filter subjects) is
// avoided or done another way (docs/deployment.md).
const MinServerVersion = "2.9.10"

// ErrServerTooOld marks a nats-server older than MinServerVersion.
var ErrServerTooOld = errors.New("nats-server too old")

// checkServerVersion refuses a connection to a server older than
// MinServerVersion, naming both versions and the fix.
func checkServerVersion(nc *nats.Conn) error {
	v := nc.ConnectedServerVersion()
	ok, err := versionAtLeast(v, MinServerVersion)
	if err != nil {
		return fmt.Errorf("nats-server at %s reports version %q: %w: cannot tell whether it is at least %s", connectedURL(nc), v, ErrServerTooOld, MinServerVersion)
	}
	if !ok {
		return fmt.Errorf("nats-server at %s is version %s: %w: tapflow needs %s or later (Debian 12's nats-server package is 2.9.10); upgrade the server", connectedURL(nc), v, ErrServerTooOld, MinServerVersion)
	}
	return nil
}

// serverAtLeast reports whether nc's server is at least version min
// (false when it cannot tell).
func serverAtLeast(nc *nats.Conn, min string) bool {
	ok, err := versionAtLeast(nc.ConnectedServerVersion(), min)
	return err == nil && ok
}

// versionAtLeast compares "major.minor.patch" versions; a leading v and a
// pre-release or build suffix (2.10.0-beta.3, 2.9.10+debian) are
// ignored, so a 2.10.0 pre-release counts as 2.10.0.
func versionAtLeast(v, min string) (bool, error) {
	a, err := parseVersion(v)
	if err != nil {
		return false, err
	}
	b, err := parseVersion(min)
	if err != nil {
		return false, err
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i], nil
		}
	}
	return true, nil
}

func parseVersion(v string) ([3]int, error) {
	var out [3]int
	s := strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(s, "-+ "); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return out, fmt.Errorf("version %q: not major.minor.patch", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, fmt.Errorf("version %q: not major.minor.patch", v)
		}
		out[i] = n
	}
	return out, nil
}

// Term tells the server never to redeliver msg, with reason in its
// advisory where the server supports one (2.10.4 and later). An older
// server ignores "+TERM <reason>" altogether (it matches only a bare
// +TERM), so the message would be redelivered every ack_wait and, with
// interest retention, never leave the stream.
func Term(nc *nats.Conn, msg jetstream.Msg, reason string) error {
	if serverAtLeast(nc, "2.10.4") {
		return msg.TermWithReason(reason)
	}
	return msg.Term()
}
