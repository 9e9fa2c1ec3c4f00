package inventory

import "testing"

func ports(n int) *Inventory {
	inv := &Inventory{Ports: make([]Port, n)}
	return inv
}

func TestDropGuard(t *testing.T) {
	type step struct {
		op      string // offer N, reread, confirm
		n       int
		applied int // ports of the inventory applied; -1 none
	}
	cases := []struct {
		name  string
		g     DropGuard
		prev  int
		steps []step
	}{
		{"within the limit applies", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100, []step{{"offer", 90, 90}}},
		{"growth applies", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100, []step{{"offer", 1000, 1000}}},
		{"drop is held until three reads", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100,
			[]step{{"offer", 89, -1}, {"reread", 0, -1}, {"reread", 0, 89}}},
		{"empty inventory is held", DropGuard{MaxDrop: 0.1, ConfirmReads: 2}, 100,
			[]step{{"offer", 0, -1}, {"reread", 0, 0}}},
		{"changing drops count as consecutive reads", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100,
			[]step{{"offer", 50, -1}, {"offer", 40, -1}, {"offer", 45, 45}}},
		{"a recovered read forgets the held one", DropGuard{MaxDrop: 0.1, ConfirmReads: 2}, 100,
			[]step{{"offer", 10, -1}, {"offer", 100, 100}, {"offer", 10, -1}, {"reread", 0, 10}}},
		{"operator confirms at once", DropGuard{MaxDrop: 0.1, ConfirmReads: 100}, 100,
			[]step{{"offer", 10, -1}, {"confirm", 0, 10}}},
		{"confirm with nothing held is a no-op", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100,
			[]step{{"confirm", 0, -1}, {"offer", 10, -1}}},
		{"reread with nothing held applies nothing", DropGuard{MaxDrop: 0.1, ConfirmReads: 3}, 100, []step{{"reread", 0, -1}}},
		{"MaxDrop 1 disables", DropGuard{MaxDrop: 1, ConfirmReads: 3}, 100, []step{{"offer", 0, 0}}},
		{"ConfirmReads 1 applies the first read", DropGuard{MaxDrop: 0.1, ConfirmReads: 1}, 100, []step{{"offer", 0, 0}}},
		{"zero value holds nothing", DropGuard{}, 100, []step{{"offer", 0, 0}}},
		{"a drop of MinPorts or fewer applies", DropGuard{MaxDrop: 0.1, ConfirmReads: 3, MinPorts: 10}, 20, []step{{"offer", 10, 10}}},
		{"a drop above MinPorts is held", DropGuard{MaxDrop: 0.1, ConfirmReads: 3, MinPorts: 10}, 20, []step{{"offer", 9, -1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := c.g
			prev := ports(c.prev)
			for i, s := range c.steps {
				var got *Inventory
				switch s.op {
				case "offer":
					got = g.Offer(prev, ports(s.n))
				case "reread":
					got = g.Reread()
				case "confirm":
					got = g.Confirm()
				}
				n := -1
				if got != nil {
					n = len(got.Ports)
					prev = got
				}
				if n != s.applied {
					t.Fatalf("step %d (%s %d): applied %d ports, want %d", i, s.op, s.n, n, s.applied)
				}
				if h, held := g.Holding(); held != (n == -1 && s.op == "offer") && s.op == "offer" {
					t.Fatalf("step %d: holding=%v %+v", i, held, h)
				}
			}
		})
	}
}

func TestDropGuardHolding(t *testing.T) {
	g := DropGuard{MaxDrop: 0.1, ConfirmReads: 3}
	if _, ok := g.Holding(); ok {
		t.Fatal("holding before anything was offered")
	}
	g.Offer(ports(200), ports(50))
	g.Reread()
	h, ok := g.Holding()
	if !ok || h.PrevPorts != 200 || h.Ports != 50 || h.Reads != 2 || h.Needed != 3 || h.Drop() != 0.75 {
		t.Fatalf("holding %+v %v", h, ok)
	}
}
