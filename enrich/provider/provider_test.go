package provider_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/inventory"
)

type static struct{ inv *inventory.Inventory }

func (s static) Poll(context.Context) (*inventory.Inventory, bool, error) { return s.inv, true, nil }

func inventoryFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	if err := os.WriteFile(path, []byte("projects:\n  - id: p1\n    name: one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAgentChooses: what an agent attributes with, for each
// inventory.provider and the synthetic source's cloud.
func TestAgentChooses(t *testing.T) {
	file := inventoryFile(t)
	synth := static{&inventory.Inventory{}}
	for _, tc := range []struct {
		name     string
		cfg      provider.Config
		synth    provider.Provider
		want     string // Chosen.Name, or the error's text
		keepsNot bool
	}{
		{"file", provider.Config{Provider: "file", File: file}, nil, "file", true},
		{"synthetic cloud without a file", provider.Config{Provider: "file"}, synth, "synthetic", false},
		{"synthetic source with a file", provider.Config{Provider: "file", File: file}, synth, "file", true},
		{"synthetic cloud with openstack and no file", provider.Config{Provider: "openstack"}, synth, "synthetic", false},
		{"nats without a connection", provider.Config{Provider: "nats"}, nil, "needs the process's NATS connection", false},
		{"nats beats the synthetic cloud", provider.Config{Provider: "nats"}, synth, "needs the process's NATS connection", false},
		{"scope node needs nats", provider.Config{Provider: "file", File: file, Scope: "node"}, nil, "set inventory.provider: nats", false},
		{"unknown", provider.Config{Provider: "ldap"}, nil, `"ldap" is not a provider`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, err := provider.Agent(tc.cfg, provider.Env{Synthetic: tc.synth})
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if ch.Name != tc.want || ch.Provider == nil || ch.Asker != nil {
				t.Fatalf("chose %q (%T, asker %v), want %q", ch.Name, ch.Provider, ch.Asker, tc.want)
			}
			k, ok := ch.Provider.(interface{ KeepsNothing() bool })
			if got := ok && k.KeepsNothing(); got != tc.keepsNot {
				t.Errorf("KeepsNothing %v, want %v", got, tc.keepsNot)
			}
		})
	}
}

// TestService: the service reads the cloud (openstack or file), never
// another service's snapshots.
func TestService(t *testing.T) {
	file := inventoryFile(t)
	p, err := provider.Service(provider.Config{Provider: "file", File: file}, provider.Env{})
	if err != nil {
		t.Fatal(err)
	}
	inv, changed, err := p.Poll(context.Background())
	if err != nil || !changed || len(inv.Projects) != 1 {
		t.Fatalf("poll: %v changed %v err %v", inv, changed, err)
	}
	for _, name := range []string{"nats", "", "synthetic"} {
		if _, err := provider.Service(provider.Config{Provider: name}, provider.Env{}); err == nil || !strings.Contains(err.Error(), "set it to openstack") {
			t.Errorf("provider %q: %v", name, err)
		}
	}
}

// TestDumpAndFilePath: dump and validate go through the same names.
func TestDumpAndFilePath(t *testing.T) {
	file := inventoryFile(t)
	var b bytes.Buffer
	if err := provider.Dump(context.Background(), provider.Config{Provider: "file", File: file}, nil, &b); err != nil || !strings.Contains(b.String(), "p1") {
		t.Fatalf("dump: %v\n%s", err, b.String())
	}
	if err := provider.Dump(context.Background(), provider.Config{Provider: "nats"}, nil, &b); err == nil {
		t.Error("dumped provider nats")
	}
	if got := provider.FilePath(provider.Config{Provider: "file", File: file}); got != file {
		t.Errorf("FilePath %q", got)
	}
	if got := provider.FilePath(provider.Config{Provider: "nats", File: file}); got != "" {
		t.Errorf("FilePath of nats %q", got)
	}
	if err := provider.Check(provider.Config{Provider: "file"}); err != nil {
		t.Errorf("Check file: %v", err)
	}
}
