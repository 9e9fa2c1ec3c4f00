package lab

import (
	"context"
	"fmt"
	"time"
)

// Events a scenario injects while traffic runs: what Nova does to a
// server's taps (unplug: delete the VM, or migrate it away; plug: boot it,
// or land it). The inventory is separate (add / remove steps), as Nova and
// Neutron are.

// attachTimeout bounds the wait for tapflow to attach a new tap (netlink
// event or the 1 s rescan; generous for a loaded CI box).
const attachTimeout = 30 * time.Second

// Unplug deletes the server's taps in the hypervisor namespace (the veth
// pairs, so the guest's devices go too); its namespace and processes stay.
func (l *Lab) Unplug(ctx context.Context, server string) error {
	s := l.Cloud.Server(server)
	if s == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	for _, p := range s.Ports {
		if err := l.ip(ctx, l.Cloud.HVNS(), "link", "del", p.HostDev); err != nil {
			return fmt.Errorf("lab: unplug %s: %w", server, err)
		}
	}
	return nil
}

// Plug recreates the server's taps (MACs, addresses, routes as at Up) and
// returns once every running pipeline has attached to them.
func (l *Lab) Plug(ctx context.Context, server string) error {
	s := l.Cloud.Server(server)
	if s == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	before := l.attachCounts()
	if err := l.wireServer(ctx, s); err != nil {
		return fmt.Errorf("lab: plug %s: %w", server, err)
	}
	var devs []string
	for _, p := range s.Ports {
		devs = append(devs, p.HostDev)
	}
	return l.waitAttached(ctx, before, devs)
}

// attachCounts counts, per pipeline, the "attached" log lines per device.
func (l *Lab) attachCounts() map[*Pipeline]map[string]int {
	l.mu.Lock()
	pipes := append([]*Pipeline(nil), l.pipes...)
	l.mu.Unlock()
	out := map[*Pipeline]map[string]int{}
	for _, p := range pipes {
		n := map[string]int{}
		for _, e := range readLog(p.logPath) {
			if e.Msg == "attached" {
				n[e.Ifname]++
			}
		}
		out[p] = n
	}
	return out
}

// waitAttached waits until every pipeline logged one more "attached" for
// each of devs than in before.
func (l *Lab) waitAttached(ctx context.Context, before map[*Pipeline]map[string]int, devs []string) error {
	deadline := time.Now().Add(attachTimeout)
	for {
		missing := ""
		for p, n := range l.attachCounts() {
			for _, d := range devs {
				if n[d] <= before[p][d] {
					missing = d
				}
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: tapflow did not attach to %s within %s", missing, attachTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
