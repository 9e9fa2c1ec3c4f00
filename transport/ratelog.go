package transport

import (
	"sync"
	"time"
)

// RateLog lets one log line through per interval and counts the rest, so
// a flood (an outage, a hostile publisher) cannot flood the log: the line
// that gets through says how many were suppressed. The zero value is ready.
type RateLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether a line may be logged now, and how many were
// suppressed since the last one that was.
func (r *RateLog) Allow(every time.Duration) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.last) < every {
		r.suppressed++
		return false, 0
	}
	r.last, suppressed, r.suppressed = time.Now(), r.suppressed, 0
	return true, suppressed
}
