package obs

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Readiness is what /readyz reports: the process is ready when every
// check added passes. Checks run on each request, so a check reads live
// state (NATS connected, inventory loaded, capture attached, not
// shutting down) and nothing has to remember to flip a flag back.
type Readiness struct {
	mu     sync.Mutex
	checks []readyCheck
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

// ServeHTTP answers 200 "ready" or 503 with the reasons, one a line.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if err := r.Err(); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ready\n")
}
