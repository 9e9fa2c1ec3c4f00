package synthetic

import (
	"context"
	"sync/atomic"

	"github.com/tapflow/tapflow/inventory"
)

// StaticProvider serves one fixed inventory. It satisfies enrich.Provider:
// the first Poll returns the inventory as changed, later polls report no
// change. Safe for concurrent use.
type StaticProvider struct {
	inv    *inventory.Inventory
	served atomic.Bool
}

// NewStaticProvider returns a provider of inv.
func NewStaticProvider(inv *inventory.Inventory) *StaticProvider {
	return &StaticProvider{inv: inv}
}

// Poll implements enrich.Provider.
func (p *StaticProvider) Poll(context.Context) (*inventory.Inventory, bool, error) {
	if p.served.Swap(true) {
		return nil, false, nil
	}
	return p.inv, true, nil
}
