package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/tapflow/tapflow/inventory"
)

// ErrNeedsPass: the port found by LookupMAC refers to a network or subnet
// the inventory lacks; only a full pass attributes it (Refresh).
var ErrNeedsPass = errors.New("the port's network or subnet is not in the inventory yet")

// LookupMAC asks Neutron for the ports with this MAC (GET
// /v2.0/ports?mac_address=…): the targeted lookup of `tapflow inventory
// serve`, which does not wait for a pass. Ports the inventory lacks are
// added when their network and subnets are known (else ErrNeedsPass),
// and Updates signals the change. Reports whether the inventory changed.
// The next pass replaces the inventory as usual (one in progress is
// followed by another, which sees the port).
func (p *Provider) LookupMAC(ctx context.Context, mac string) (bool, error) {
	p.mu.Lock()
	cl, base := p.lookupCl, p.inv
	p.mu.Unlock()
	if cl == nil || base == nil {
		return false, errors.New("openstack lookup: no complete inventory yet")
	}
	c := colPorts
	c.query = url.Values{"mac_address": {strings.ToLower(mac)}}
	ports, err := list[inventory.Port](ctx, p, cl.network, c)
	if err != nil {
		p.count(err)
		return false, fmt.Errorf("openstack lookup %s: %w", mac, p.scrub(err))
	}
	var add []inventory.Port
	for _, np := range ports {
		if slices.ContainsFunc(base.Ports, func(o inventory.Port) bool { return o.ID == np.ID }) {
			continue
		}
		if !slices.ContainsFunc(base.Networks, func(n inventory.Network) bool { return n.ID == np.NetworkID }) {
			return false, ErrNeedsPass
		}
		for _, ip := range np.FixedIPs {
			if !slices.ContainsFunc(base.Subnets, func(s inventory.Subnet) bool { return s.ID == ip.SubnetID }) {
				return false, ErrNeedsPass
			}
		}
		add = append(add, np)
	}
	if len(add) == 0 {
		return false, nil
	}
	next := *base
	next.Ports = append(slices.Clone(base.Ports), add...)
	sortInventory(&next)
	sum, err := hashInventory(&next)
	if err != nil {
		return false, fmt.Errorf("openstack lookup: %w", err)
	}
	p.mu.Lock()
	if p.inv != base { // a pass finished meanwhile: it read Neutron after us
		p.mu.Unlock()
		return false, nil
	}
	p.inv, p.hash = &next, sum
	p.gen++
	p.mu.Unlock()
	select {
	case p.updates <- struct{}{}:
	default:
	}
	// A pass in progress may have listed the ports before this one
	// existed and would drop it again: queue one more pass after it.
	if p.passMu.TryLock() {
		p.passMu.Unlock()
	} else {
		p.Refresh()
	}
	p.log.Info("targeted lookup added ports", "mac", mac, "ports", len(add))
	return true, nil
}
