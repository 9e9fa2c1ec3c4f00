package inventory

// DropGuard holds back an inventory that lost more than MaxDrop of the
// previous inventory's ports: a truncated file, an API answering a short
// page, or a misconfigured filter looks exactly like that, and applying it
// would turn every missing port into a ghost that expires. A held inventory
// is applied once ConfirmReads consecutive reads of the source (the first
// included) show the drop, or once an operator confirms it. The zero value
// holds nothing back. Not safe for concurrent use.
type DropGuard struct {
	// MaxDrop is the largest fraction of ports (0..1) a new inventory may
	// lose without being held; 1 or more disables the guard.
	MaxDrop float64
	// ConfirmReads is how many consecutive reads showing the drop apply
	// it (≤ 1: the first read does).
	ConfirmReads int
	// MinPorts: drops of at most this many ports always apply (a small
	// cloud loses whole percents with every deleted VM).
	MinPorts int

	held    *Inventory
	prevN   int
	reads   int
	confirm bool
}

// Held describes an inventory held back.
type Held struct {
	PrevPorts, Ports int
	Reads, Needed    int
}

// Drop is the fraction of ports lost.
func (h Held) Drop() float64 {
	if h.PrevPorts == 0 {
		return 0
	}
	return float64(h.PrevPorts-h.Ports) / float64(h.PrevPorts)
}

// Offer passes a newly read inventory next, which would replace prev. It
// returns the inventory to apply: next when it is within MaxDrop (a held
// one is forgotten) or confirmed, nil when next is held back.
func (g *DropGuard) Offer(prev, next *Inventory) *Inventory {
	if prev == nil || next == nil || g.MaxDrop >= 1 || len(prev.Ports) == 0 ||
		len(prev.Ports)-len(next.Ports) <= g.MinPorts ||
		float64(len(prev.Ports)-len(next.Ports)) <= g.MaxDrop*float64(len(prev.Ports)) {
		g.reset()
		return next
	}
	if g.held == nil {
		g.prevN = len(prev.Ports)
	}
	g.held = next
	g.reads++
	return g.release()
}

// Reread says the source was read again and still gives the held
// inventory (its content did not change). It returns the inventory to
// apply once that confirms the drop, else nil.
func (g *DropGuard) Reread() *Inventory {
	if g.held == nil {
		return nil
	}
	g.reads++
	return g.release()
}

// Confirm applies the held inventory at the next Offer or Reread, or
// returns it now; nil when nothing is held.
func (g *DropGuard) Confirm() *Inventory {
	if g.held == nil {
		return nil
	}
	g.confirm = true
	return g.release()
}

// Holding describes the inventory held back; ok=false when none is.
func (g *DropGuard) Holding() (h Held, ok bool) {
	if g.held == nil {
		return Held{}, false
	}
	return Held{PrevPorts: g.prevN, Ports: len(g.held.Ports), Reads: g.reads, Needed: max(g.ConfirmReads, 1)}, true
}

func (g *DropGuard) release() *Inventory {
	if !g.confirm && g.reads < g.ConfirmReads {
		return nil
	}
	inv := g.held
	g.reset()
	return inv
}

func (g *DropGuard) reset() { g.held, g.prevN, g.reads, g.confirm = nil, 0, 0, false }
