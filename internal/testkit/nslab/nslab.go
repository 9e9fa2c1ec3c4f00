//go:build linux

// Package nslab builds throwaway "VMs" for capture tests: each VM is a
// network namespace whose eth0 is the peer of a veth named tap… in the
// test's own namespace, and the taps are enslaved to a bridge there — the
// shape of a Linux-bridge compute node. The root namespace gets no address
// and no route; every address lives inside namespaces the lab created, and
// Close (registered with t.Cleanup) deletes all of it.
package nslab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// Lab is one bridge with VMs on it.
type Lab struct {
	t      testing.TB
	ID     string // random, unique per lab: names are tap<ID><n>
	Bridge string
	VMs    []*VM
}

// VM is a namespace with eth0 = the peer of Tap.
type VM struct {
	Name    string // netns name
	Tap     string // host-side veth
	IP      net.IP
	MAC     net.HardwareAddr
	Ifindex int // of Tap
	ns      netns.NsHandle
}

// need stops t when the lab cannot be built (internal/testkit/prereq).
func need(t testing.TB) {
	t.Helper()
	prereq.Root(t, "to create network namespaces and attach eBPF")
	prereq.Command(t, "ip", "make deps (deploy/scripts/deps.sh) installs Debian's iproute2 package")
}

// New creates an empty lab (a bridge) and registers its removal.
func New(t testing.TB) *Lab {
	t.Helper()
	need(t)
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)[:5]
	l := &Lab{t: t, ID: id, Bridge: "brt" + id}
	t.Cleanup(l.Close)
	// mcast_snooping 0: a snooping bridge joins 224.0.0.106 and floods
	// its own IGMP reports to every tap within its first second or so,
	// packets no test sent that can land in a pinned stop's export (as
	// lab/up.go's bridges).
	l.ip("link", "add", l.Bridge, "type", "bridge", "mcast_snooping", "0")
	l.sysctl("", "net.ipv6.conf."+l.Bridge+".disable_ipv6=1")
	l.ip("link", "set", l.Bridge, "up")
	return l
}

// Glob matches exactly this lab's taps.
func (l *Lab) Glob() string { return "tap" + l.ID + "*" }

// hostDevice matches the host-side devices any Lab makes: its bridge
// (brt<id>) and its taps (tap<id><n>), id five hex digits.
var hostDevice = regexp.MustCompile(`^(brt[0-9a-f]{5}|tap[0-9a-f]{5}[0-9]{1,3})$`)

// IsHostDevice reports whether name is a host device a Lab names so, for
// tests that watch the host's devices while other packages' labs come
// and go. Nova's taps (tap + 11 characters of the port id) never match.
func IsHostDevice(name string) bool { return hostDevice.MatchString(name) }

// AddVM creates VM n (1..250) with address 10.213.<x>.n/24 on the bridge.
// bridged=false leaves the tap outside the bridge (for attach-only tests).
func (l *Lab) AddVM(n int, bridged bool) *VM {
	l.t.Helper()
	vm := &VM{Name: fmt.Sprintf("nsl%s-%d", l.ID, n), Tap: fmt.Sprintf("tap%s%d", l.ID, n)}
	l.ip("netns", "add", vm.Name)
	l.ip("link", "add", vm.Tap, "type", "veth", "peer", "name", "eth0", "netns", vm.Name)
	l.sysctl("", "net.ipv6.conf."+vm.Tap+".disable_ipv6=1")
	l.sysctl(vm.Name, "net.ipv6.conf.all.disable_ipv6=1")
	l.sysctl(vm.Name, "net.ipv6.conf.default.disable_ipv6=1")
	vm.IP = net.IPv4(10, 213, 7, byte(n)).To4()
	l.ip("-n", vm.Name, "addr", "add", vm.IP.String()+"/24", "dev", "eth0")
	l.ip("-n", vm.Name, "link", "set", "eth0", "up")
	l.ip("-n", vm.Name, "link", "set", "lo", "up")
	if bridged {
		l.ip("link", "set", vm.Tap, "master", l.Bridge)
	}
	l.ip("link", "set", vm.Tap, "up")
	ifc, err := net.InterfaceByName(vm.Tap)
	if err != nil {
		l.t.Fatalf("nslab: %v", err)
	}
	vm.Ifindex = ifc.Index
	ns, err := netns.GetFromName(vm.Name)
	if err != nil {
		l.t.Fatalf("nslab: open netns %s: %v", vm.Name, err)
	}
	vm.ns = ns
	err = vm.Do(func() error {
		e, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		vm.MAC = e.HardwareAddr
		return nil
	})
	if err != nil {
		l.t.Fatalf("nslab: %v", err)
	}
	l.VMs = append(l.VMs, vm)
	return vm
}

// RemoveVM deletes a VM's tap and namespace.
func (l *Lab) RemoveVM(vm *VM) {
	l.t.Helper()
	l.ip("link", "del", vm.Tap)
	vm.ns.Close()
	l.ip("netns", "del", vm.Name)
	for i, v := range l.VMs {
		if v == vm {
			l.VMs = append(l.VMs[:i], l.VMs[i+1:]...)
			break
		}
	}
}

// Close deletes everything the lab created; errors are logged only.
func (l *Lab) Close() {
	for _, vm := range l.VMs {
		vm.ns.Close()
		exec.Command("ip", "link", "del", vm.Tap).Run()
		exec.Command("ip", "netns", "del", vm.Name).Run()
	}
	l.VMs = nil
	exec.Command("ip", "link", "del", l.Bridge).Run()
}

// Do runs f on an OS thread that is inside the VM's namespace. Sockets
// created in f stay in that namespace after Do returns.
func (vm *VM) Do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(vm.ns); err != nil {
		return fmt.Errorf("enter netns %s: %w", vm.Name, err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("nslab: cannot return to the original netns: %v", err))
		}
	}()
	return f()
}

func (l *Lab) ip(args ...string) {
	l.t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("nslab: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *Lab) sysctl(ns, kv string) {
	l.t.Helper()
	args := []string{"sysctl", "-q", "-w", kv}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		l.t.Fatalf("nslab: %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
