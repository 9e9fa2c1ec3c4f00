// Package lookup is the targeted lookup between agents and `tapflow
// inventory serve`: an agent that holds records of a VM MAC its snapshot
// does not know asks the service (NATS request on transport.InventoryLookupSubject); the service
// re-reads its provider at once, rate-limited and coalesced across agents,
// and the answer reaches every agent as an ordinary delta, so late binding
// attributes the held records before their window ends.
//
// Asker is the agent side (at most one request per MAC per interval,
// bounded), Server the service side (per-MAC coalescing window and a
// token bucket in front of the provider).
package lookup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/transport"
)

// Requests go to transport.InventoryLookupSubject: the payload is one MAC
// (aa:bb:cc:dd:ee:ff), the reply one word (see Server.Handle).

// queueGroup: with several service instances only one answers a request.
const queueGroup = "tapflow-inventory-serve"

// Replies of the service.
const (
	ReplyQueried   = "queried"   // the provider is re-read now
	ReplyCoalesced = "coalesced" // the same MAC was asked within the window
	ReplyLimited   = "limited"   // the rate limit was reached; ask again later
	ReplyInvalid   = "invalid"   // not a unicast MAC
)

// AskerOptions tune an Asker; zero values take the defaults.
type AskerOptions struct {
	// Interval: a MAC is asked at most once per Interval (default 30 s,
	// half the default late-binding window: a second chance within it).
	Interval time.Duration
	// MaxMACs bounds the MACs remembered (default 4096); beyond it new
	// MACs are dropped (counted) until old entries age out.
	MaxMACs int
	// Queue bounds the requests waiting to be sent (default 256).
	Queue int
	// Timeout per request (default 2 s).
	Timeout  time.Duration
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Asker sends lookup requests for unknown VM MACs. Ask never blocks;
// Run sends. Safe for concurrent use.
type Asker struct {
	nc    *nats.Conn
	o     AskerOptions
	log   *slog.Logger
	total *prometheus.CounterVec

	mu    sync.Mutex
	asked map[string]time.Time // MAC -> when last queued
	queue chan string
	warn  time.Time // last "unanswered" log
}

// Asker results counted in tapflow_inventory_lookups_total{result}.
var askResults = []string{"sent", "answered", "unanswered", "dropped"}

// NewAsker validates and registers the metrics; it sends nothing.
func NewAsker(nc *nats.Conn, o AskerOptions) (*Asker, error) {
	if nc == nil {
		return nil, errors.New("inventory lookup: no NATS connection")
	}
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.MaxMACs <= 0 {
		o.MaxMACs = 4096
	}
	if o.Queue <= 0 {
		o.Queue = 256
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &Asker{nc: nc, o: o, log: o.Logger.With("component", "inventory-lookup"),
		asked: make(map[string]time.Time), queue: make(chan string, o.Queue)}
	a.total = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_lookups_total",
		Help: "Targeted lookups of unknown VM MACs asked of inventory serve, by result: sent, answered, unanswered (timeout, no service), dropped (queue or MAC table full)."},
		[]string{"result"})
	if err := o.Registry.Register(a.total); err != nil {
		return nil, fmt.Errorf("inventory lookup metrics: %w", err)
	}
	for _, r := range askResults {
		a.total.WithLabelValues(r)
	}
	return a, nil
}

// Ask queues a request for mac unless it was asked within the interval.
// Group (multicast) MACs and unparsable ones are ignored. Never blocks.
func (a *Asker) Ask(mac string) {
	now := a.o.Now()
	a.mu.Lock()
	if at, ok := a.asked[mac]; ok && now.Sub(at) < a.o.Interval {
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw[0]&1 != 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.asked[mac]; !ok && len(a.asked) >= a.o.MaxMACs {
		for m, at := range a.asked { // forget what aged out
			if now.Sub(at) >= a.o.Interval {
				delete(a.asked, m)
			}
		}
		if len(a.asked) >= a.o.MaxMACs {
			a.total.WithLabelValues("dropped").Inc()
			return
		}
	}
	select {
	case a.queue <- mac:
		a.asked[mac] = now
	default:
		a.total.WithLabelValues("dropped").Inc()
	}
}

// Run sends the queued requests until ctx ends. A request nobody answers
// is counted and logged (at most once a minute); attribution goes on.
func (a *Asker) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case mac := <-a.queue:
			a.send(ctx, mac)
		}
	}
}

func (a *Asker) send(ctx context.Context, mac string) {
	rctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
	defer cancel()
	a.total.WithLabelValues("sent").Inc()
	msg, err := a.nc.RequestWithContext(rctx, transport.InventoryLookupSubject, []byte(mac))
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		a.total.WithLabelValues("unanswered").Inc()
		if now := time.Now(); now.Sub(a.warn) > time.Minute {
			a.warn = now
			a.log.Warn("inventory lookup not answered; the MAC waits for the next snapshot", "mac", mac, "err", err,
				"fix", "check that tapflow inventory serve runs on this NATS and agents may publish "+transport.InventoryLookupSubject)
		}
		return
	}
	a.total.WithLabelValues("answered").Inc()
	a.log.Debug("inventory lookup answered", "mac", mac, "reply", string(msg.Data))
}
