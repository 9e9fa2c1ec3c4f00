package roles_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/roles"
)

// TestGeneratedDocsAreCurrent: the permission sections of the docs are
// what transport/roles renders now (make check-generate runs it).
func TestGeneratedDocsAreCurrent(t *testing.T) {
	files := map[string]bool{}
	for _, r := range roles.Regions {
		files[r.File] = true
	}
	for f := range files {
		b, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		want, err := roles.Update(f, string(b))
		if err != nil {
			t.Fatal(err)
		}
		if want != string(b) {
			t.Errorf("%s: the permission sections are stale (transport/roles changed): run make generate", f)
		}
	}
}

// TestNamesAgree: the names the permissions use are the ones the code
// publishes, consumes and stores under.
func TestNamesAgree(t *testing.T) {
	for _, c := range [][2]string{
		{roles.FlowsStream, transport.FlowsStream},
		{roles.MetersStream, transport.MetersStream},
		{roles.DLQStream, transport.DLQStream},
		{roles.FlowsSubjectRoot + ".n1", transport.FlowsSubject("n1")},
		{roles.MetersSubjectRoot + ".n1", transport.MetersSubject("n1")},
		{roles.DefaultDurable, transport.DefaultDurable},
		{roles.MetersDurableSuffix, transport.MetersDurableSuffix},
		{roles.InventoryBucket, natsinv.Bucket},
		{roles.InventoryStream, natsinv.StreamName},
		{roles.InventoryObject, natsinv.Object},
		{roles.LeaseBucket, natsinv.LeaseBucket},
		{roles.InventoryMeta, natsinv.MetaSubject},
		{roles.InventoryDelta, natsinv.DeltaSubject},
		{roles.InventoryCurrent, natsinv.CurrentSubject},
		{roles.InventoryLookup, lookup.Subject},
	} {
		if c[0] != c[1] {
			t.Errorf("roles has %q, the code %q", c[0], c[1])
		}
	}
}

// TestProtected: an ordered subscriber is denied every collector's and
// every other subscriber's durable, including a custom collector.durable
// and one passed only as the embedded server's own, never its own.
func TestProtected(t *testing.T) {
	users := []roles.User{
		{Name: "c1", Role: roles.Collector, Durable: "billing"},
		{Name: "a", Role: roles.Subscriber, Durable: "analytics"},
		{Name: "tap", Role: roles.Subscriber, Ordered: true, Durable: "tapdur"},
	}
	prot := roles.Protected(users, "hub")
	p := roles.For(users[2], prot)
	for _, c := range []string{"tapflow-collector", "tapflow-collector-meters", "billing", "billing-meters", "hub", "hub-meters", "analytics"} {
		for _, s := range []string{"$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS." + c, "$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS." + c + ".>", "$JS.API.CONSUMER.MSG.NEXT.TAPFLOW_METERS." + c, "$JS.API.CONSUMER.DELETE.TAPFLOW_FLOWS." + c} {
			if !slices.Contains(p.PublishDeny, s) {
				t.Errorf("ordered subscriber not denied %s", s)
			}
		}
	}
	for _, s := range p.PublishDeny {
		if s == "$JS.API.CONSUMER.MSG.NEXT.TAPFLOW_FLOWS.tapdur" {
			t.Error("ordered subscriber denied its own durable")
		}
	}
	for _, s := range p.Publish {
		if s == "$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS" || strings.Contains(s, ".DURABLE.") {
			t.Errorf("ordered subscriber allowed %s", s)
		}
	}
}
