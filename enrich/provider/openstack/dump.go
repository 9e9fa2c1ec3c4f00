package openstack

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/inventory"
)

// Dump fetches the inventory once (no retry) and writes it to w in the
// static inventory file format (docs/inventory.md), preceded by comments
// saying where it came from and which best-effort collections failed. The
// output loads with inventory.Parse, so a lab can replay it with provider
// file. A failed required collection returns the error and writes nothing.
func Dump(ctx context.Context, cfg Config, log *slog.Logger, w io.Writer) error {
	p, err := New(cfg, log, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer p.Close()
	p.passMu.Lock()
	start := time.Now()
	inv, stale, err := p.fetch(ctx)
	p.passMu.Unlock()
	if err != nil {
		return p.scrub(err)
	}
	sortInventory(inv)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# tapflow inventory dump: %s\n", p.Source())
	fmt.Fprintf(&b, "# fetched %s in %s\n", start.UTC().Format(time.RFC3339), time.Since(start).Round(time.Millisecond))
	if len(stale) > 0 {
		fmt.Fprintf(&b, "# INCOMPLETE: %s failed (see the log); they are empty here\n", strings.Join(stale, ", "))
	}
	if err := WriteInventory(&b, inv); err != nil {
		return err
	}
	_, err = w.Write(b.Bytes())
	return err
}

// WriteInventory writes inv as an inventory file (YAML, one collection per
// top-level key, every collection present).
func WriteInventory(w io.Writer, inv *inventory.Inventory) error {
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(inv); err != nil {
		return fmt.Errorf("write inventory: %w", err)
	}
	return enc.Close()
}
