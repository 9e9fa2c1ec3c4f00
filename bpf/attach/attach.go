//go:build linux

package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Mode selects how programs are attached.
type Mode string

// Modes. Auto uses tcx and falls back to tc when the kernel lacks it.
const (
	Auto Mode = "auto"
	TCX  Mode = "tcx"
	TC   Mode = "tc"
)

// Modes lists the valid values of Mode.
func Modes() []Mode { return []Mode{Auto, TCX, TC} }

// Valid reports whether m is a known mode.
func (m Mode) Valid() bool {
	for _, v := range Modes() {
		if m == v {
			return true
		}
	}
	return false
}

// Names and priority of the cls_bpf filters (tc mode).
const (
	FilterNameIngress = "tapflow_tx"
	FilterNameEgress  = "tapflow_rx"
	filterPrefix      = "tapflow_"
	filterPriority    = 1
	filterHandle      = 0x7af1
)

// Attacher attaches an ingress and an egress program.
type Attacher struct {
	mode            Mode
	ingress, egress *ebpf.Program
	linkDir         string // bpffs directory for pinned tcx links; "" = none
	mu              sync.Mutex
	effective       Mode // tcx or tc once known
}

// New checks its arguments; it attaches nothing. With linkDir (a bpffs
// directory) tcx links are pinned there, so they — and the programs — stay
// attached when the process exits; Attach then adopts a link pinned for
// the interface by a previous run, swapping in the new programs.
func New(mode Mode, ingress, egress *ebpf.Program, linkDir string) (*Attacher, error) {
	if !mode.Valid() {
		return nil, fmt.Errorf("attach mode %q: want one of auto, tcx, tc", mode)
	}
	if ingress == nil || egress == nil {
		return nil, errors.New("attach: ingress and egress programs are required")
	}
	a := &Attacher{mode: mode, ingress: ingress, egress: egress, linkDir: linkDir}
	if mode != Auto {
		a.effective = mode
	}
	return a, nil
}

// Mode is the attach method in use: tcx or tc; auto until the first attach.
func (a *Attacher) Mode() Mode {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.effective == "" {
		return Auto
	}
	return a.effective
}

// Handle is one interface's pair of attachments.
type Handle struct {
	Ifindex int
	Ifname  string
	Mode    Mode
	// Adopted: the attachment was made by a previous run (a pinned link,
	// or a cls_bpf filter of ours) and now runs this run's programs.
	Adopted bool
	links   []link.Link
	pinned  bool
	filters []*netlink.BpfFilter
}

// Attach attaches both programs to the interface. On error nothing stays
// attached.
func (a *Attacher) Attach(ifindex int, ifname string) (*Handle, error) {
	a.mu.Lock()
	mode := a.effective
	a.mu.Unlock()
	if mode == "" || mode == TCX {
		h, err := a.attachTCX(ifindex, ifname)
		if err == nil {
			a.setEffective(TCX)
			return h, nil
		}
		if mode == TCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return nil, err
		}
		// auto: the kernel has no tcx (< 6.6): use tc from now on.
		a.setEffective(TC)
	}
	return a.attachTC(ifindex, ifname)
}

func (a *Attacher) setEffective(m Mode) {
	a.mu.Lock()
	a.effective = m
	a.mu.Unlock()
}

func (a *Attacher) attachTCX(ifindex int, ifname string) (*Handle, error) {
	h := &Handle{Ifindex: ifindex, Ifname: ifname, Mode: TCX, pinned: a.linkDir != ""}
	for _, p := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
		dir  string
	}{{a.ingress, ebpf.AttachTCXIngress, "ingress"}, {a.egress, ebpf.AttachTCXEgress, "egress"}} {
		if a.linkDir != "" {
			l, err := adoptTCX(PinPath(a.linkDir, ifindex, p.dir), ifindex, p.at, p.prog)
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("adopt tcx %s %s: %w", ifname, p.dir, err)
			}
			if l != nil {
				h.links = append(h.links, l)
				h.Adopted = true
				continue
			}
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: p.prog, Attach: p.at})
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("attach tcx %s %s: %w", ifname, p.dir, err)
		}
		h.links = append(h.links, l)
		if a.linkDir != "" {
			if err := l.Pin(PinPath(a.linkDir, ifindex, p.dir)); err != nil {
				h.Close()
				return nil, fmt.Errorf("pin tcx link %s %s: %w", ifname, p.dir, err)
			}
		}
	}
	return h, nil
}

// PinPath is where the link of (ifindex, ingress|egress) is pinned.
func PinPath(linkDir string, ifindex int, dir string) string {
	return filepath.Join(linkDir, fmt.Sprintf("%d-%s", ifindex, dir))
}

// adoptTCX loads the link pinned at path. A live link of this interface
// and hook gets prog (an atomic swap: no packet goes unseen) and is
// returned; a stale one (its interface is gone: the kernel reports ifindex
// 0) is unpinned, and nil returned. No pin: nil.
func adoptTCX(path string, ifindex int, at ebpf.AttachType, prog *ebpf.Program) (link.Link, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", path, err)
	}
	info, err := l.Info()
	if err == nil {
		if t := info.TCX(); t != nil && int(t.Ifindex) == ifindex && ebpf.AttachType(t.AttachType) == at {
			if err := l.Update(prog); err != nil {
				l.Close()
				return nil, fmt.Errorf("swap the program of pinned link %s: %w", path, err)
			}
			return l, nil
		}
	}
	// Stale: made for an interface that is gone.
	l.Unpin()
	l.Close()
	return nil, nil
}

func clsact(ifindex int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
}

func (a *Attacher) attachTC(ifindex int, ifname string) (*Handle, error) {
	if err := netlink.QdiscReplace(clsact(ifindex)); err != nil {
		return nil, fmt.Errorf("add clsact qdisc to %s: %w", ifname, err)
	}
	h := &Handle{Ifindex: ifindex, Ifname: ifname, Mode: TC}
	for _, p := range []struct {
		prog   *ebpf.Program
		parent uint32
		name   string
	}{{a.ingress, netlink.HANDLE_MIN_INGRESS, FilterNameIngress}, {a.egress, netlink.HANDLE_MIN_EGRESS, FilterNameEgress}} {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: ifindex, Parent: p.parent, Handle: filterHandle,
				Protocol: unix.ETH_P_ALL, Priority: filterPriority,
			},
			Fd: p.prog.FD(), Name: p.name, DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			h.Close()
			return nil, fmt.Errorf("attach cls_bpf %s %s: %w", ifname, p.name, err)
		}
		h.filters = append(h.filters, f)
	}
	return h, nil
}

// Keep releases this process's handles but leaves the programs attached:
// pinned tcx links stay (a restarted agent adopts them); cls_bpf filters
// stay. Without pinning a tcx link is detached when its handle closes.
func (h *Handle) Keep() error {
	var errs []error
	for _, l := range h.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("release tcx link %s: %w", h.Ifname, err))
		}
	}
	h.links, h.filters = nil, nil
	return errors.Join(errs...)
}

// Close detaches (and unpins). Detaching from an interface that is gone is
// not an error.
func (h *Handle) Close() error {
	var errs []error
	for _, l := range h.links {
		if h.pinned {
			if err := l.Detach(); err != nil && !gone(err) && !errors.Is(err, unix.ENOLINK) {
				errs = append(errs, fmt.Errorf("detach tcx %s: %w", h.Ifname, err))
			}
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin tcx %s: %w", h.Ifname, err))
			}
		}
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach tcx %s: %w", h.Ifname, err))
		}
	}
	h.links = nil
	for _, f := range h.filters {
		if err := netlink.FilterDel(f); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("delete cls_bpf %s %s: %w", h.Ifname, f.Name, err))
		}
	}
	h.filters = nil
	return errors.Join(errs...)
}

func gone(err error) bool {
	return errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL)
}

// RemoveStale deletes cls_bpf filters named tapflow_* from the clsact
// hooks of an interface: leftovers of a run that died. It returns how many
// it removed.
func RemoveStale(ifindex int) (int, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		if gone(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("look up ifindex %d: %w", ifindex, err)
	}
	n := 0
	var errs []error
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(l, parent)
		if err != nil {
			if gone(err) {
				continue // no clsact qdisc
			}
			errs = append(errs, fmt.Errorf("list filters of %s: %w", l.Attrs().Name, err))
			continue
		}
		for _, f := range fs {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || !strings.HasPrefix(bf.Name, filterPrefix) {
				continue
			}
			if err := netlink.FilterDel(bf); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("delete stale filter %s on %s: %w", bf.Name, l.Attrs().Name, err))
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}
