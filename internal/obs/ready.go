package obs

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Readiness is what /readyz reports: the process is ready when every
// check added passes. Checks run on each request, so a check reads live
// state (NATS connected, inventory loaded, capture attached, not
// shutting down) and nothing has to remember to flip a flag back.
type Readiness struct {
	mu     sync.Mutex
	checks []readyCheck
	notes  []readyNote
}

// readyNote is something an operator should know that does not make the
// process unready (a capture pin that will not outlive the agent).
type readyNote struct {
	name string
	fn   func() string
}

type readyCheck struct {
	name string
	fn   func() error
}

// NewReadiness returns a Readiness with no checks: not ready ("starting")
// until the process adds its first one.
func NewReadiness() *Readiness { return &Readiness{} }

// Add adds a check; fn returns nil when that part is ready, else why not.
func (r *Readiness) Add(name string, fn func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks = append(r.checks, readyCheck{name, fn})
}

// Note adds a note: fn returns "" when there is nothing to say. /readyz
// appends the notes ("note: name: text", one a line), ready or not.
func (r *Readiness) Note(name string, fn func() string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, readyNote{name, fn})
}

// notesText is the notes that have something to say, one a line.
func (r *Readiness) notesText() string {
	r.mu.Lock()
	notes := append([]readyNote(nil), r.notes...)
	r.mu.Unlock()
	var b strings.Builder
	for _, n := range notes {
		if s := n.fn(); s != "" {
			fmt.Fprintf(&b, "note: %s: %s\n", n.name, s)
		}
	}
	return b.String()
}

// Err is nil when the process is ready, else every reason it is not.
func (r *Readiness) Err() error {
	r.mu.Lock()
	checks := append([]readyCheck(nil), r.checks...)
	r.mu.Unlock()
	if len(checks) == 0 {
		return errors.New("starting")
	}
	var errs []error
	for _, c := range checks {
		if err := c.fn(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

// ServeHTTP answers 200 "ready" or 503 with the reasons, one a line,
// followed by the notes.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	notes := r.notesText()
	if err := r.Err(); err != nil {
		msg := "not ready: " + err.Error()
		if notes != "" {
			msg += "\n" + strings.TrimSuffix(notes, "\n")
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ready\n"+notes)
}
