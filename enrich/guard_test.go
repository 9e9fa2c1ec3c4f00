package enrich

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/inventory"
)

// cloudOf is an inventory of n VM ports on one network.
func cloudOf(n int) string {
	var b strings.Builder
	b.WriteString("networks:\n  - {id: n1, project_id: t1}\nsubnets:\n  - {id: s1, network_id: n1, cidr: 10.0.0.0/16}\nports:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {id: p%d, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:%02x:%02x\", device_owner: compute:nova, fixed_ips: [{subnet_id: s1, ip_address: 10.0.%d.%d}]}\n",
			i, i>>8, i&0xff, i>>8, 1+i&0xff)
	}
	return b.String()
}

func TestDropGuardFileProvider(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		next     string
		confirm  string // "reads", "operator"
		held     bool
		wantEndp int
	}{
		{"small drop applies at once", cloudOf(95), "", false, 95},
		{"growth applies at once", cloudOf(150), "", false, 150},
		{"big drop held, confirmed by 3 reads", cloudOf(50), "reads", true, 50},
		{"big drop held, confirmed by the operator", cloudOf(50), "operator", true, 50},
		{"empty file rejected, last good kept", "", "", false, 100},
		{"truncated JSON rejected, last good kept", `{"ports": [{"id": "p1"`, "", false, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fx := newFixture(t, cloudOf(100), nil)
			if err := fx.e.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if n := fx.e.Snapshot().Stats().Endpoints; n != 100 {
				t.Fatalf("endpoints %d", n)
			}
			if g := testutil.ToFloat64(fx.e.m.invHeld); g != 0 {
				t.Fatalf("held gauge %v at start", g)
			}
			fx.write(c.next)
			err := fx.e.Load(ctx)
			if c.next == "" || strings.HasPrefix(c.next, "{") {
				if err == nil {
					t.Fatal("bad file accepted")
				}
				if v := fx.e.Snapshot().Version(); v != 1 {
					t.Fatalf("bad file replaced the snapshot: v%d", v)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if held := testutil.ToFloat64(fx.e.m.invHeld) == 1; held != c.held {
				t.Fatalf("held %v, want %v", held, c.held)
			}
			if c.held {
				if n := fx.e.Snapshot().Stats().Endpoints; n != 100 {
					t.Fatalf("held inventory applied: %d endpoints", n)
				}
				if g := testutil.ToFloat64(fx.e.m.heldTotal); g != 1 {
					t.Errorf("held_total %v", g)
				}
				switch c.confirm {
				case "reads":
					for i := 2; i <= 3; i++ {
						if n := fx.e.Snapshot().Stats().Endpoints; n != 100 {
							t.Fatalf("applied after %d reads", i-1)
						}
						if err := fx.e.Load(ctx); err != nil {
							t.Fatal(err)
						}
					}
				case "operator":
					if !fx.e.ConfirmDrop() {
						t.Fatal("ConfirmDrop: nothing held")
					}
				}
				if g := testutil.ToFloat64(fx.e.m.confirmed.WithLabelValues(c.confirm)); g != 1 {
					t.Errorf("confirmed{by=%s} %v", c.confirm, g)
				}
				if g := testutil.ToFloat64(fx.e.m.invHeld); g != 0 {
					t.Errorf("held gauge %v after confirm", g)
				}
			}
			if n := fx.e.Snapshot().Stats().Endpoints; n != c.wantEndp {
				t.Fatalf("endpoints %d, want %d", n, c.wantEndp)
			}
			if fx.e.ConfirmDrop() {
				t.Error("ConfirmDrop with nothing held reported a hold")
			}
		})
	}
}

// readsProvider serves fixed inventories and counts reads like the
// openstack provider: polls between reads are not reads.
type readsProvider struct {
	mu      sync.Mutex
	inv     *inventory.Inventory
	changed bool
	reads   uint64
}

func (p *readsProvider) set(inv *inventory.Inventory) {
	p.mu.Lock()
	p.inv, p.changed = inv, true
	p.reads++
	p.mu.Unlock()
}
func (p *readsProvider) read() { p.mu.Lock(); p.reads++; p.mu.Unlock() }
func (p *readsProvider) Reads() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads
}
func (p *readsProvider) Poll(context.Context) (*inventory.Inventory, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.changed {
		return nil, false, nil
	}
	p.changed = false
	return p.inv, true, nil
}

func TestDropGuardCountsReadsNotPolls(t *testing.T) {
	ctx := context.Background()
	p := &readsProvider{}
	fx := newFixture(t, "", func(c *Config) { c.Inventory.File = "unused" })
	e, err := New(fx.e.cfg, nil, nil, WithProvider(p))
	if err != nil {
		t.Fatal(err)
	}
	big, _ := inventory.Parse([]byte(cloudOf(100)), "big")
	small, _ := inventory.Parse([]byte(cloudOf(20)), "small")
	p.set(big)
	if err := e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	p.set(small)
	for range 10 { // polls without a new read do not confirm
		if err := e.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.Snapshot().Stats().Endpoints; n != 100 {
		t.Fatalf("applied by polls: %d endpoints", n)
	}
	p.read()
	_ = e.Load(ctx)
	if n := e.Snapshot().Stats().Endpoints; n != 100 {
		t.Fatalf("applied after 2 reads: %d", n)
	}
	p.read()
	_ = e.Load(ctx)
	if n := e.Snapshot().Stats().Endpoints; n != 20 {
		t.Fatalf("not applied after 3 reads: %d endpoints", n)
	}
}
