package obs

import (
	"regexp"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tapflow/tapflow/internal/version"
)

// Registry is a process's one metrics registry. The convention (docs/operations.md,
// Metrics): every component takes a prometheus.Registerer in its options
// (nil: nothing registered), defines its metric names once, next to the code
// that counts them, and registers them in its constructor with every
// labelled loss or discard series pre-created at 0. No package uses the
// global registry or promauto. Registry also remembers every name that was
// registered, so tests can list the metrics of a process — a labelled
// vector without children is invisible to Gather.
type Registry struct {
	*prometheus.Registry
	mu    sync.Mutex
	names map[string]struct{}
}

// NewRegistry returns a registry with the Go and process collectors and
// tapflow_build_info.
func NewRegistry() *Registry {
	r := &Registry{Registry: prometheus.NewRegistry(), names: map[string]struct{}{}}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), BuildInfo())
	return r
}

// BuildInfo is tapflow_build_info{version,revision,goversion} = 1.
func BuildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tapflow_build_info",
		Help: "Always 1; the labels say which build runs (version, VCS revision, Go version).",
		ConstLabels: prometheus.Labels{
			"version": version.Version, "revision": version.Commit(), "goversion": version.GoVersion(),
		},
	})
	g.Set(1)
	return g
}

// Register registers c and remembers its metric names.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = struct{}{}
		}
	}
	return nil
}

// MustRegister is Register that panics on an error (a programming error:
// a name registered twice).
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Names returns every metric name ever registered, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.names))
	for n := range r.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// fqName reads the name out of Desc.String(), the only place a Desc shows it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)
