package roles_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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

// TestNamesAgree: the subjects the permissions build from transport/names
// are the ones the code publishes and dead-letters on (both take the
// names from transport/names; the subjects are built apart).
func TestNamesAgree(t *testing.T) {
	for _, c := range [][2]string{
		{roles.FlowsSubjectRoot + ".n1", transport.FlowsSubject("n1")},
		{roles.MetersSubjectRoot + ".n1", transport.MetersSubject("n1")},
		{roles.DLQSubjects[:len(roles.DLQSubjects)-1] + "flows.n1", transport.DLQSubject(transport.DLQFlowsSubject, transport.FlowsSubject("n1"))},
	} {
		if c[0] != c[1] {
			t.Errorf("roles has %q, the code %q", c[0], c[1])
		}
	}
}

// TestConsumerRightsByName: every consumer right of every role names
// one consumer the user owns (no wildcard over names, no deny list): an
// ordered subscriber's are its slots, a durable subscriber's its
// durable, a collector's its two durables.
func TestConsumerRightsByName(t *testing.T) {
	for _, tc := range []struct {
		u    roles.User
		owns []string
	}{
		{roles.User{Name: "tap", Role: roles.Subscriber, Ordered: true}, []string{"tap-0", "tap-1", "tap-2", "tap-3"}},
		{roles.User{Name: "replay", Role: roles.Subscriber, Ordered: true, Slots: 2, Durable: "replaydur"}, []string{"replay-0", "replay-1", "replaydur"}},
		{roles.User{Name: "an", Role: roles.Subscriber, Durable: "analytics"}, []string{"analytics"}},
		{roles.User{Name: "c", Role: roles.Collector, Durable: "billing"}, []string{"billing", "billing-meters"}},
		{roles.User{Name: "c", Role: roles.Collector}, []string{"tapflow-collector", "tapflow-collector-meters"}},
		{roles.User{Name: "a", Role: roles.Agent, Node: "n1"}, nil},
		{roles.User{Name: "i", Role: roles.Inventory}, []string{"tapflow-inventory-sums"}},
	} {
		t.Run(tc.u.Name+"/"+string(tc.u.Role), func(t *testing.T) {
			p := roles.For(tc.u)
			got := map[string]bool{}
			for _, s := range p.Publish {
				var rest string
				switch {
				case strings.HasPrefix(s, "$JS.API.CONSUMER.LIST."):
					continue // names and counts (the collector's backlog gauges)
				case strings.HasPrefix(s, "$JS.API.CONSUMER.") || strings.HasPrefix(s, "$JS.ACK."):
					f := strings.Split(s, ".")
					i := 3 // $JS.ACK.<stream>.<consumer>.>
					if f[1] == "API" {
						i = 5 // $JS.API.CONSUMER.<OP>.<stream>.<consumer>
						if f[3] == "MSG" || f[3] == "DURABLE" {
							i = 6 // $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
						}
					}
					if len(f) <= i {
						t.Fatalf("%s: a consumer operation without a consumer name", s)
					}
					rest = f[i]
				default:
					continue
				}
				if strings.ContainsAny(rest, "*>") {
					t.Errorf("%s: a consumer right by wildcard", s)
				}
				got[rest] = true
			}
			var names []string
			for n := range got {
				names = append(names, n)
			}
			slices.Sort(names)
			if !slices.Equal(names, tc.owns) {
				t.Errorf("consumer rights on %v, want exactly %v", names, tc.owns)
			}
			for _, s := range p.Publish {
				if s == "$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS" || s == ">" && tc.u.Role != roles.Admin {
					t.Errorf("allowed %s", s)
				}
			}
		})
	}
}

// TestConflicts: a consumer name two users would own is refused with
// both owners named; collectors may share durables.
func TestConflicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		users []roles.User
		extra []string
		want  string // "" = none
	}{
		{"the doc's fleet", roles.Example().Users, nil, ""},
		{"collectors share a durable", []roles.User{{Name: "c1", Role: roles.Collector}, {Name: "c2", Role: roles.Collector}}, []string{"tapflow-collector"}, ""},
		{"slot is another subscriber's durable", []roles.User{{Name: "an", Role: roles.Subscriber, Durable: "tap-1"}, {Name: "tap", Role: roles.Subscriber, Ordered: true}}, nil,
			`"tap-1" is both subscriber an's durable and ordered subscriber tap's slot`},
		{"slot is collector.durable", []roles.User{{Name: "tap", Role: roles.Subscriber, Ordered: true}}, []string{"tap-0"},
			`"tap-0" is both collector.durable's flows durable and ordered subscriber tap's slot`},
		{"slot beyond the default count", []roles.User{{Name: "x", Role: roles.Subscriber, Durable: "tap-5"}, {Name: "tap", Role: roles.Subscriber, Ordered: true, Slots: 6}}, nil,
			`"tap-5" is both subscriber x's durable and ordered subscriber tap's slot`},
		{"two subscribers, one durable", []roles.User{{Name: "a", Role: roles.Subscriber, Durable: "d"}, {Name: "b", Role: roles.Subscriber, Durable: "d"}}, nil,
			`"d" is both subscriber a's durable and subscriber b's durable`},
		{"subscriber on a collector's meters durable", []roles.User{{Name: "c", Role: roles.Collector, Durable: "billing"}, {Name: "s", Role: roles.Subscriber, Durable: "billing-meters"}}, nil,
			`"billing-meters" is both collector c's meters durable and subscriber s's durable`},
		{"subscriber on the default durable", []roles.User{{Name: "s", Role: roles.Subscriber, Durable: "tapflow-collector"}}, nil,
			`"tapflow-collector" is both the default collector's flows durable and subscriber s's durable`},
		{"own durable in own slot", []roles.User{{Name: "tap", Role: roles.Subscriber, Ordered: true, Durable: "tap-2"}}, nil,
			`"tap-2" is both subscriber tap's durable and ordered subscriber tap's slot`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := roles.Conflicts(tc.users, tc.extra...)
			switch {
			case tc.want == "" && len(cf) > 0:
				t.Fatalf("unexpected conflicts %+v", cf)
			case tc.want != "" && (len(cf) != 1 || cf[0].Problem != tc.want):
				t.Fatalf("conflicts %+v, want one: %s", cf, tc.want)
			}
		})
	}
}
