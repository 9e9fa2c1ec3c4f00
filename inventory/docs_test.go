package inventory_test

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// TestDocsExample keeps the complete example of docs/inventory.md valid and
// its table true.
func TestDocsExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/inventory.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## Complete example")
	if !ok {
		t.Fatal("no complete example")
	}
	_, block, _ := strings.Cut(after, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	inv, err := inventory.Parse([]byte(block), "docs/inventory.md")
	if err != nil {
		t.Fatal(err)
	}
	s := snapshot.Build(inv, snapshot.Options{Version: 1})
	if a := s.Anomalies(); len(a) != 0 {
		t.Fatalf("example has anomalies: %v", a)
	}
	const acme, globex, service = "5d1b6f1e9c4a4f0e8f0f7a1b2c3d4e5f", "9a8b7c6d5e4f40312a1b2c3d4e5f6a7b", "0c3f1e2d4b5a46978e1f2a3b4c5d6e7f"
	cases := []struct {
		name                  string
		dir                   schemas.Direction
		vm, peer              string
		local, remote         string
		tenant, zone, ext, lb string
		seg                   int32
	}{
		{"app1 to internet", schemas.DirTX, "fa:16:3e:20:00:01", "fa:16:3e:10:00:02", "10.0.2.10", "8.8.8.8", acme, "external", "public", "", 0},
		{"app1 from DHCP", schemas.DirRX, "fa:16:3e:20:00:01", "fa:16:3e:10:00:04", "10.0.2.10", "10.0.2.2", acme, "infra", "none", "", 0},
		{"client to VIP", schemas.DirTX, "fa:16:3e:20:00:02", "fa:16:3e:31:00:01", "10.0.1.30", "10.0.1.100", globex, "other_tenant", "none", "", 1},
		{"amphora from client", schemas.DirRX, "fa:16:3e:31:00:01", "fa:16:3e:20:00:02", "10.0.1.100", "10.0.1.30", acme, "other_tenant", "none", "f0000001-lb", 1},
		{"amphora to member", schemas.DirTX, "fa:16:3e:31:00:02", "fa:16:3e:20:00:01", "10.0.2.101", "10.0.2.10", acme, "infra", "none", "f0000001-lb", 2},
		{"member from amphora", schemas.DirRX, "fa:16:3e:20:00:01", "fa:16:3e:31:00:02", "10.0.2.10", "10.0.2.101", acme, "infra", "none", "f0000001-lb", 2}, // lb_id on the member side too (flow.v1.1)
		{"management port", schemas.DirTX, "fa:16:3e:31:00:00", "fa:16:3e:10:00:99", "172.31.0.11", "172.31.0.5", service, "same_tenant", "none", "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm, _ := snapshot.ParseMAC(c.vm)
			peer, _ := snapshot.ParseMAC(c.peer)
			in := snapshot.Input{Dir: c.dir, VMMAC: vm, PeerMAC: peer, LocalIP: netip.MustParseAddr(c.local), RemoteIP: netip.MustParseAddr(c.remote)}
			var r snapshot.Result
			s.Attribute(&in, &r)
			if r.TenantID != c.tenant || r.Zone.String() != c.zone || r.ExternalNetwork != c.ext || r.LBID != c.lb || r.LBSegment != c.seg {
				t.Errorf("got %s %s %s %s %d", r.TenantID, r.Zone, r.ExternalNetwork, r.LBID, r.LBSegment)
			}
		})
	}
}
