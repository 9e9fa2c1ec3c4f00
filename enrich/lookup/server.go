package lookup

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/transport"
)

// ServerOptions tune a Server; zero values take the defaults.
type ServerOptions struct {
	// Rate is the provider queries allowed per second on average
	// (default 0.2: one per 5 s), Burst how many at once (default 3).
	Rate  float64
	Burst int
	// Window: the same MAC asked again within it (by any agent) costs
	// no new query (default 10 s).
	Window time.Duration
	// MaxMACs bounds the MACs remembered for the window (default 65536).
	MaxMACs  int
	Registry prometheus.Registerer
	Now      func() time.Time
}

// Server answers lookups: a MAC not asked within the window, with a token
// left in the bucket, triggers one provider query (query). Safe for
// concurrent use.
type Server struct {
	o     ServerOptions
	query func(mac string)
	total *prometheus.CounterVec

	mu     sync.Mutex
	recent map[string]time.Time
	tokens float64
	last   time.Time
}

var serveResults = []string{ReplyQueried, ReplyCoalesced, ReplyLimited, ReplyInvalid}

// NewServer validates and registers the metrics; query is called (it
// must not block) with the MAC (lower case) of each lookup let through.
func NewServer(query func(mac string), o ServerOptions) (*Server, error) {
	if query == nil {
		return nil, errors.New("inventory lookup server: no query function")
	}
	if o.Rate < 0 || o.Burst < 0 {
		return nil, fmt.Errorf("inventory lookup server: rate %v burst %d: must not be negative", o.Rate, o.Burst)
	}
	if o.Rate == 0 {
		o.Rate = 0.2
	}
	if o.Burst == 0 {
		o.Burst = 3
	}
	if o.Window <= 0 {
		o.Window = 10 * time.Second
	}
	if o.MaxMACs <= 0 {
		o.MaxMACs = 65536
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Server{o: o, query: query, recent: make(map[string]time.Time), tokens: float64(o.Burst)}
	s.total = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_serve_lookups_total",
		Help: "Targeted lookups answered, by result: queried (provider re-read), coalesced (same MAC within the window), limited (rate limit), invalid."},
		[]string{"result"})
	if err := o.Registry.Register(s.total); err != nil {
		return nil, fmt.Errorf("inventory lookup server metrics: %w", err)
	}
	for _, r := range serveResults {
		s.total.WithLabelValues(r)
	}
	return s, nil
}

// Handle decides one request and returns the reply.
func (s *Server) Handle(mac string) string {
	r := s.handle(mac)
	s.total.WithLabelValues(r).Inc()
	return r
}

func (s *Server) handle(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw[0]&1 != 0 {
		return ReplyInvalid
	}
	mac = hw.String() // one spelling per MAC
	now := s.o.Now()
	s.mu.Lock()
	if at, ok := s.recent[mac]; ok && now.Sub(at) < s.o.Window {
		s.mu.Unlock()
		return ReplyCoalesced
	}
	// token bucket
	if !s.last.IsZero() {
		s.tokens = min(float64(s.o.Burst), s.tokens+now.Sub(s.last).Seconds()*s.o.Rate)
	}
	s.last = now
	if s.tokens < 1 {
		s.mu.Unlock()
		return ReplyLimited
	}
	s.tokens--
	if len(s.recent) >= s.o.MaxMACs {
		for m, at := range s.recent {
			if now.Sub(at) >= s.o.Window {
				delete(s.recent, m)
			}
		}
		if len(s.recent) >= s.o.MaxMACs {
			clear(s.recent) // only coalescing is lost, never a query's bound
		}
	}
	s.recent[mac] = now
	s.mu.Unlock()
	s.query(mac)
	return ReplyQueried
}

// Subscribe answers requests on transport.InventoryLookupSubject (queue
// group: one instance answers each) until the subscription is drained.
func (s *Server) Subscribe(nc *nats.Conn) (*nats.Subscription, error) {
	sub, err := nc.QueueSubscribe(transport.InventoryLookupSubject, queueGroup, func(m *nats.Msg) {
		_ = m.Respond([]byte(s.Handle(string(m.Data))))
	})
	if err != nil {
		return nil, fmt.Errorf("inventory lookup: subscribe %s: %w", transport.InventoryLookupSubject, err)
	}
	return sub, nil
}

// Total is the counter of one reply (tests, dashboards).
func (s *Server) Total(reply string) prometheus.Counter { return s.total.WithLabelValues(reply) }
