package synthetic

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

var _ enrich.Provider = (*StaticProvider)(nil)

// attributionOf is the enrich columns of f, for comparison.
type attributionOf struct {
	Tenant, Server, Port, Zone, PeerTenant, ExtNet, LB, LBTap string
	Segment                                                   int32
	Version                                                   int64
}

func colsOf(f *schemas.Flow) attributionOf {
	return attributionOf{f.TenantID, f.ServerID, f.PortID, f.Zone, f.PeerTenantID, f.ExternalNetwork, f.LBID, f.LBTap, f.LBSegment, f.MetadataVersion}
}

func clearAttribution(f *schemas.Flow) {
	f.TenantID, f.ServerID, f.PortID, f.Zone, f.PeerTenantID, f.ExternalNetwork, f.LBID, f.LBTap = "", "", "", "", "", "", "", ""
	f.LBSegment, f.MetadataVersion = 0, 0
}

// newEngine returns an enrich engine loaded with the source's inventory.
func newEngine(t *testing.T, s *Source, cfg enrich.Config) *enrich.Engine {
	t.Helper()
	eng, err := enrich.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(),
		enrich.WithProvider(s.Provider()), enrich.WithClock(fixedClock))
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := eng.Snapshot().Version(); v != ExpectedMetadataVersion {
		t.Fatalf("first snapshot has version %d, want %d", v, ExpectedMetadataVersion)
	}
	return eng
}

// TestEnrichAgreement runs the real enrich engine over the raw records and
// checks that it reproduces, for every record, the attribution the
// generator expects from the cloud's meaning. A disagreement names the
// rule (the flow kind) and shows one record.
func TestEnrichAgreement(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(c *Config)
		kinds int // distinct rules the run must exercise
	}{
		{"default mix", func(*Config) {}, 24},
		{"one tenant, one VM", func(c *Config) {
			c.Tenants, c.VMsPerTenant, c.LoadBalancers = 1, 1, 1
			c.ZoneMix[ClassSameTenant], c.ZoneMix[ClassOtherTenant] = 0, 0
		}, 18}, // no same/other tenant, no routed or cross-tenant LB clients
		{"two VMs per tenant, many exits", func(c *Config) { c.Tenants, c.VMsPerTenant, c.ExternalNetworks = 9, 2, 4 }, 23}, // no same-subnet VM pair
		{"address plan wraps", func(c *Config) { c.Tenants, c.VMsPerTenant, c.LoadBalancers = 300, 12, 130 }, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Attributed, c.RecordsPerSecond, c.FlowsPerSecond = true, 0, 5000
			tc.edit(&c)
			s := newSource(t, c, Options{})
			var kinds []string
			g := newGenerator(c, s.topo, "node-1", 0)
			g.trace = func(fl *flow) { kinds = append(kinds, fl.kind) }
			const n = 100000
			want := g.fill(make([]schemas.Flow, 0, n), n, epoch.UnixMicro())

			raw := slices.Clone(want)
			for i := range raw {
				clearAttribution(&raw[i])
			}
			ecfg := enrich.DefaultConfig()
			ecfg.LateBinding.MaxRecords = 0 // unknown MACs out at once, in order
			eng := newEngine(t, s, ecfg)
			b := pipeline.NewBatch(raw, nil)
			if err := eng.Apply(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			if len(b.Records) != n {
				t.Fatalf("enrich returned %d records of %d", len(b.Records), n)
			}
			type miss struct {
				n         int
				got, want attributionOf
				rec       schemas.Flow
			}
			bad := map[string]*miss{}
			seen := map[string]bool{}
			for i := range want {
				seen[kinds[i]] = true
				got, exp := colsOf(&b.Records[i]), colsOf(&want[i])
				if got == exp {
					continue
				}
				m := bad[kinds[i]]
				if m == nil {
					r := b.Records[i]
					clearAttribution(&r)
					m = &miss{got: got, want: exp, rec: r}
					bad[kinds[i]] = m
				}
				m.n++
			}
			for kind, m := range bad {
				t.Errorf("rule %q: enrich disagrees on %d records, e.g.\n  record %+v\n  enrich    %+v\n  generator %+v", kind, m.n, m.rec, m.got, m.want)
			}
			if len(seen) != tc.kinds {
				ks := make([]string, 0, len(seen))
				for k := range seen {
					ks = append(ks, k)
				}
				slices.Sort(ks)
				t.Errorf("%d rules exercised, want %d:\n  %s", len(seen), tc.kinds, strings.Join(ks, "\n  "))
			}
		})
	}
}

// TestEnrichLateBinding: with late binding on, miss records leave their
// batch and come back at Flush, still miss; nothing is lost.
func TestEnrichLateBinding(t *testing.T) {
	c := fastConfig()
	c.Attributed = true
	s := newSource(t, c, Options{Now: fixedClock})
	g := newGenerator(c, s.topo, "node-1", 0)
	const n = 20000
	want := g.fill(nil, n, epoch.UnixMicro())
	raw := slices.Clone(want)
	misses := 0
	for i := range raw {
		clearAttribution(&raw[i])
		if want[i].Zone == zoneMiss {
			misses++
		}
	}
	eng := newEngine(t, s, enrich.DefaultConfig())
	b := pipeline.NewBatch(raw, nil)
	if err := eng.Apply(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if misses == 0 || len(b.Records) != n-misses {
		t.Fatalf("%d records after Apply, want %d (%d held)", len(b.Records), n-misses, misses)
	}
	held := eng.Flush()
	if len(held) != misses {
		t.Fatalf("Flush returned %d records, want %d", len(held), misses)
	}
	count := func(recs []schemas.Flow) map[string]int {
		m := map[string]int{}
		for i := range recs {
			m[fmt.Sprint(colsOf(&recs[i]))]++
		}
		return m
	}
	got, exp := count(append(b.Records, held...)), count(want)
	for k, v := range exp {
		if got[k] != v {
			t.Errorf("%s: %d records, want %d", k, got[k], v)
		}
	}
}

// TestEnrichInPipeline wires the source to the engine and a counting sink
// through the real runner, as `tapflow run` does.
func TestEnrichInPipeline(t *testing.T) {
	c := fastConfig()
	c.RecordsPerSecond, c.FlowsPerSecond, c.BatchRecords = 200000, 5000, 2000
	reg := prometheus.NewRegistry()
	s := newSource(t, c, Options{Registry: reg})
	eng, err := enrich.New(enrich.DefaultConfig(), slog.New(slog.DiscardHandler), reg, enrich.WithProvider(s.Provider()))
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	sink := &countSink{zones: map[string]int{}}
	r, err := pipeline.NewRunner(pipeline.Config{Name: "agent"}, s, []pipeline.Transform{eng}, sink, pipeline.NewMetrics(reg), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	emitted := counterValue(t, reg, "tapflow_synthetic_records_total")
	if emitted == 0 || float64(sink.n) != emitted {
		t.Fatalf("sink got %d records, source emitted %v", sink.n, emitted)
	}
	for _, z := range []string{zoneSame, zoneOther, zoneShared, zoneExternal, zoneInfra, zoneMcast, zoneMiss} {
		if sink.zones[z] == 0 {
			t.Errorf("no %s records in %v", z, sink.zones)
		}
	}
}

type countSink struct {
	n     int
	zones map[string]int
}

func (s *countSink) Name() string { return "count" }
func (s *countSink) Run(_ context.Context, in <-chan *pipeline.Batch) error {
	for b := range in {
		s.n += len(b.Records)
		for i := range b.Records {
			s.zones[b.Records[i].Zone]++
		}
		b.Ack(nil)
	}
	return nil
}
