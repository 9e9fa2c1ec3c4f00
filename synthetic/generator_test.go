package synthetic

import (
	"context"
	"log/slog"
	"math"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func fixedClock() time.Time { return epoch }

func newSource(t testing.TB, c Config, opts Options) *Source {
	t.Helper()
	if opts.Node == "" {
		opts.Node = "node-1"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runFor runs s like the pipeline runner does (a consumer acks every batch;
// out is closed after Run returns) until at least n records arrived, then
// cancels and returns every record and batch received.
func runFor(t testing.TB, s *Source, n int) ([]schemas.Flow, []*pipeline.Batch) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *pipeline.Batch, 2)
	errc := make(chan error, 1)
	go func() {
		errc <- s.Run(ctx, out)
		close(out)
	}()
	var recs []schemas.Flow
	var batches []*pipeline.Batch
	for b := range out {
		recs = append(recs, b.Records...)
		batches = append(batches, b)
		b.Ack(nil)
		if len(recs) >= n {
			cancel()
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	return recs, batches
}

func fastConfig() Config {
	c := DefaultConfig()
	c.RecordsPerSecond, c.FlowsPerSecond, c.BatchRecords = 0, 2000, 4096
	return c
}

func TestDeterminism(t *testing.T) {
	const n = 30000
	base := fastConfig()
	want, _ := runFor(t, newSource(t, base, Options{Now: fixedClock}), n)
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		opts Options
		same bool // identical records; else differ in most records
	}{
		{"same seed and config", func(*Config) {}, Options{Now: fixedClock}, true},
		{"batching does not change the stream", func(c *Config) { c.BatchRecords = 1000 }, Options{Now: fixedClock}, true},
		{"batch age does not change the stream", func(c *Config) { c.BatchMaxAge = units.Duration(time.Hour) }, Options{Now: fixedClock}, true},
		{"recycled arrays do not change the stream", func(*Config) {}, Options{Now: fixedClock, RecycleArrays: true}, true},
		{"real clock: equal but for times", func(*Config) {}, Options{}, true},
		{"other seed", func(c *Config) { c.Seed = 2 }, Options{Now: fixedClock}, false},
		{"other flow count", func(c *Config) { c.FlowsPerSecond = 2001 }, Options{Now: fixedClock}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			got, _ := runFor(t, newSource(t, c, tc.opts), n)
			if len(got) < n {
				t.Fatalf("got %d records, want ≥ %d", len(got), n)
			}
			diff := 0
			for i := range n {
				g, w := got[i], want[i]
				if tc.opts.Now == nil {
					if g.TimeStart > g.TimeEnd || g.TimeEnd < time.Now().Add(-time.Hour).UnixMicro() {
						t.Fatalf("record %d: times %d..%d do not follow the clock", i, g.TimeStart, g.TimeEnd)
					}
					g.TimeStart, g.TimeEnd = w.TimeStart, w.TimeEnd
				}
				if g != w {
					diff++
					if tc.same {
						t.Fatalf("record %d differs:\n got %+v\nwant %+v", i, g, w)
					}
				}
			}
			if !tc.same && diff < n*9/10 {
				t.Errorf("only %d of %d records differ", diff, n)
			}
		})
	}
	t.Run("every Run restarts the stream", func(t *testing.T) {
		s := newSource(t, base, Options{Now: fixedClock})
		runFor(t, s, 5000)
		again, _ := runFor(t, s, n)
		for i := range n {
			if again[i] != want[i] {
				t.Fatalf("record %d differs on the second Run", i)
			}
		}
	})
}

var ifnameRE = regexp.MustCompile(`^tap[0-9a-z-]{1,11}$`)

// TestRawRecords: records look like the ebpf source's: wire fields set and
// consistent, attribution columns empty.
func TestRawRecords(t *testing.T) {
	s := newSource(t, fastConfig(), Options{Node: "cmp-7"})
	recs, batches := runFor(t, s, 20000)
	for i, b := range batches {
		if b.Seq != int64(i+1) {
			t.Fatalf("batch %d has seq %d", i, b.Seq)
		}
	}
	ends := map[string]int{}
	for i, f := range recs {
		ends[f.EndReason]++
		src, err1 := netip.ParseAddr(f.SrcIP)
		dst, err2 := netip.ParseAddr(f.DstIP)
		_, okV := snapshot.ParseMAC(f.VMMAC)
		_, okP := snapshot.ParseMAC(f.PeerMAC)
		switch {
		case f.Node != "cmp-7" || !ifnameRE.MatchString(f.Ifname):
			t.Fatalf("record %d: node %q ifname %q", i, f.Node, f.Ifname)
		case f.Direction != "tx" && f.Direction != "rx":
			t.Fatalf("record %d: direction %q", i, f.Direction)
		case err1 != nil || err2 != nil || !src.Is4() || !dst.Is4() || f.IPVersion != 4 || !okV || !okP:
			t.Fatalf("record %d: bad addresses %+v", i, f)
		case f.Packets < 1 || f.Bytes < 60*f.Packets || f.Bytes > 1514*f.Packets || f.TimeStart > f.TimeEnd:
			t.Fatalf("record %d: counters or times %+v", i, f)
		case f.Protocol != protoTCP && f.TCPFlags != 0, f.Protocol == protoTCP && f.TCPFlags&flagACK == 0:
			t.Fatalf("record %d: tcp flags %#x for protocol %d", i, f.TCPFlags, f.Protocol)
		case f.EndReason == "fin" && f.TCPFlags&flagFIN == 0, f.EndReason == "rst" && f.TCPFlags&flagRST == 0:
			t.Fatalf("record %d: end %s with flags %#x", i, f.EndReason, f.TCPFlags)
		case f.TenantID != "" || f.ServerID != "" || f.PortID != "" || f.Zone != "" || f.PeerTenantID != "" ||
			f.ExternalNetwork != "" || f.LBID != "" || f.LBSegment != 0 || f.MetadataVersion != 0:
			t.Fatalf("record %d: attribution columns set on a raw record: %+v", i, f)
		}
	}
	// about one record in five ends its flow (records per flow 5 at rate 0)
	if n := ends["fin"] + ends["rst"] + ends["idle_timeout"]; math.Abs(float64(n)/float64(len(recs))-0.2) > 0.02 {
		t.Errorf("end reasons %v: %d flow ends in %d records", ends, n, len(recs))
	}
}

// recordClass recovers the traffic class from an attributed record.
func recordClass(f *schemas.Flow) string {
	switch f.LBSegment {
	case 1:
		return ClassLBSegment1
	case 2:
		return ClassLBSegment2
	}
	return f.Zone
}

func TestZoneMixProportions(t *testing.T) {
	for _, tc := range []struct {
		name string
		mix  ZoneMix
	}{
		{"default", DefaultConfig().ZoneMix},
		{"external and miss", ZoneMix{ClassExternal: 1, ClassMiss: 1}},
		{"octavia and multicast", ZoneMix{ClassLBSegment1: 1, ClassLBSegment2: 3, ClassMulticast: 1, ClassShared: 0}},
		{"one class", ZoneMix{ClassInfra: 0.5}},
		{"rare class", ZoneMix{ClassSameTenant: 99, ClassOtherTenant: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Attributed, c.FlowsPerSecond, c.RecordsPerSecond, c.ZoneMix = true, 5000, 0, tc.mix
			s := newSource(t, c, Options{Now: fixedClock})
			g := newGenerator(c, s.topo, "n", 0)
			const n = 300000
			recs := g.fill(make([]schemas.Flow, 0, n), n, 1)
			got := map[string]int{}
			for i := range recs {
				got[recordClass(&recs[i])]++
			}
			total := 0.0
			for _, w := range tc.mix {
				total += w
			}
			for _, cl := range Classes {
				want := tc.mix[cl] / total
				share := float64(got[cl]) / n
				delete(got, cl)
				// records come in flows of ~5: ≈ 60k independent draws,
				// σ ≤ 0.2 %; 1 point is 5σ. A class off by weight is not.
				if math.Abs(share-want) > 0.01 || (want == 0) != (share == 0) {
					t.Errorf("%s: %.4f of records, want %.4f", cl, share, want)
				}
			}
			if len(got) > 0 {
				t.Errorf("records of no class: %v", got)
			}
		})
	}
}

func TestTopologyMatchesSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *Config)
	}{
		{"default", func(*Config) {}},
		{"one tenant one VM", func(c *Config) {
			c.Tenants, c.VMsPerTenant, c.LoadBalancers = 1, 1, 1
			c.ZoneMix = ZoneMix{ClassExternal: 1}
		}},
		{"address plan wraps", func(c *Config) { c.Tenants, c.VMsPerTenant, c.LoadBalancers, c.ExternalNetworks = 300, 40, 130, 7 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			s := newSource(t, c, Options{})
			snap := snapshot.Build(s.Inventory(), snapshot.Options{Version: 1})
			if a := snap.Anomalies(); len(a) != 0 {
				t.Fatalf("anomalies: %v", a[:min(5, len(a))])
			}
			if st := snap.Stats(); st.Endpoints != c.Tenants*c.VMsPerTenant+5*c.LoadBalancers {
				t.Errorf("endpoints %d, want %d", st.Endpoints, c.Tenants*c.VMsPerTenant+5*c.LoadBalancers)
			}
			tp := s.topo
			seen := map[string]bool{}
			for _, e := range append(append([]endpoint{}, tp.vms...), tp.unknown...) {
				if seen[e.ifname] || seen[e.mac] || seen[e.ip] {
					t.Fatalf("tap %s / %s / %s not unique", e.ifname, e.mac, e.ip)
				}
				seen[e.ifname], seen[e.mac], seen[e.ip] = true, true, true
				m, _ := snapshot.ParseMAC(e.mac)
				if _, known := snap.Endpoint(m, 0); known != (e.tenantIdx >= 0) {
					t.Fatalf("tap %s: known to the snapshot = %v", e.ifname, known)
				}
			}
		})
	}
}

// TestFillNoAllocs: generating records (new flows included) allocates
// nothing; only the batch slice does.
func TestFillNoAllocs(t *testing.T) {
	for _, attributed := range []bool{false, true} {
		c := DefaultConfig()
		c.Attributed = attributed
		s := newSource(t, c, Options{})
		g := newGenerator(c, s.topo, "n", 0)
		buf := make([]schemas.Flow, 0, 4096)
		if a := testing.AllocsPerRun(20, func() { buf = g.fill(buf[:0], 4096, 1) }); a != 0 {
			t.Errorf("attributed=%v: %.1f allocations per 4096 records", attributed, a)
		}
	}
}
