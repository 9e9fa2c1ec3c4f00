package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writePorts(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("networks:\n  - {id: n1, project_id: t1}\nports:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {id: p%d, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:01:%02x:%02x\", device_owner: compute:nova}\n", i, i>>8, i&0xff)
	}
	if err := os.WriteFile(path+".tmp", []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// POST /-/inventory/confirm applies the inventory the drop guard holds.
func TestConfirmEndpointAppliesAHeldDrop(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Inventory.File = filepath.Join(dir, "inv.yaml")
	writePorts(t, cfg.Inventory.File, 100)
	rt := newRT(t, nil)
	a, err := newAgent(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	defer a.engine.Close()
	ctx := context.Background()
	if err := a.engine.Load(ctx); err != nil {
		t.Fatal(err)
	}
	h := confirmHandler(func() (bool, bool) {
		f := rt.confirmDrop.Load()
		if f == nil {
			return false, false
		}
		return true, (*f)()
	})
	post := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/-/inventory/confirm", nil))
		return w.Code
	}
	if c := post(); c != http.StatusConflict {
		t.Fatalf("nothing held: %d", c)
	}
	writePorts(t, cfg.Inventory.File, 20)
	if err := a.engine.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.engine.Snapshot().Stats().Endpoints; n != 100 {
		t.Fatalf("drop applied without confirmation: %d endpoints", n)
	}
	if c := post(); c != http.StatusOK {
		t.Fatalf("confirm: %d", c)
	}
	if n := a.engine.Snapshot().Stats().Endpoints; n != 20 {
		t.Fatalf("after confirm: %d endpoints", n)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/-/inventory/confirm", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", w.Code)
	}
}
