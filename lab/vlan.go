package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// A VLAN-aware guest (a trunk port's VM) without 802.1Q devices: the test
// kernels have neither CONFIG_VLAN_8021Q nor tc's vlan action, so the lab
// tags in eBPF on the guest's device. The subport's addresses sit on the
// parent device; egress, an IPv4 packet from the subport's subnet gets the
// subport's tag (bpf_skb_vlan_push); ingress, any tag is popped
// (bpf_skb_vlan_pop) so the guest's stack takes the frame. ARP stays
// untagged (harmless: the capture counts IP only). The programs live as
// long as the lab server of the guest's namespace holding their links.

// VLANTag tags a guest device's packets from one subnet with a VLAN id.
type VLANTag struct {
	Dev    string
	VID    int
	Subnet netip.Prefix // IPv4
}

func (v VLANTag) String() string { return fmt.Sprintf("%s:%d:%s", v.Dev, v.VID, v.Subnet) }

// ParseVLANTag parses DEV:VID:CIDR.
func ParseVLANTag(s string) (VLANTag, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return VLANTag{}, fmt.Errorf("vlan %q: want DEV:VID:CIDR (e.g. eth0:100:10.0.100.0/24)", s)
	}
	vid, err := strconv.Atoi(parts[1])
	if err != nil || vid < 1 || vid > 4094 {
		return VLANTag{}, fmt.Errorf("vlan %q: VLAN id must be 1-4094", s)
	}
	p, err := netip.ParsePrefix(parts[2])
	if err != nil || !p.Addr().Is4() {
		return VLANTag{}, fmt.Errorf("vlan %q: %q is not an IPv4 CIDR", s, parts[2])
	}
	return VLANTag{Dev: parts[0], VID: vid, Subnet: p.Masked()}, nil
}

// __sk_buff offsets (include/uapi/linux/bpf.h).
const (
	skbProtocol    = 16
	skbVLANPresent = 20
	tcxNext        = -1
	ipSrcOffset    = 14 + 12 // Ethernet header, then the IPv4 source
)

// pushProgram tags IPv4 packets whose source lies in subnet with vid.
func pushProgram(vid int, subnet netip.Prefix) asm.Instructions {
	a := subnet.Addr().As4()
	m := net.CIDRMask(subnet.Bits(), 32)
	// The 4 source bytes read as a little-endian word, like the constants.
	netLE := binary.LittleEndian.Uint32(a[:])
	maskLE := binary.LittleEndian.Uint32(m)
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbProtocol, asm.Word),
		asm.JNE.Imm32(asm.R2, 0x0008, "out"), // htons(ETH_P_IP)
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, ipSrcOffset),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -4),
		asm.Mov.Imm(asm.R4, 4),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R2, asm.RFP, -4, asm.Word),
		asm.And.Imm32(asm.R2, int32(maskLE)),
		asm.JNE.Imm32(asm.R2, int32(netLE), "out"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0x0081), // htons(ETH_P_8021Q)
		asm.Mov.Imm(asm.R3, int32(vid)),
		asm.FnSkbVlanPush.Call(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("out"),
		asm.Return(),
	}
}

// popProgram removes the VLAN tag of received frames.
func popProgram() asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbVLANPresent, asm.Word),
		asm.JEq.Imm(asm.R2, 0, "out"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnSkbVlanPop.Call(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("out"),
		asm.Return(),
	}
}

// AttachVLANTags loads and attaches the tagging programs (tcx) in the
// current network namespace; closing the result detaches them.
func AttachVLANTags(tags []VLANTag) (closeAll func() error, err error) {
	var closers []func() error
	closeAll = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	attach := func(dev string, insns asm.Instructions, at ebpf.AttachType) error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "lab_vlan", Type: ebpf.SchedCLS, Instructions: insns, License: "Dual BSD/GPL"})
		if err != nil {
			return fmt.Errorf("load: %w", err)
		}
		closers = append(closers, prog.Close)
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: prog, Attach: at})
		if err != nil {
			return fmt.Errorf("attach tcx to %s: %w", dev, err)
		}
		closers = append(closers, l.Close)
		return nil
	}
	popped := map[string]bool{}
	for _, t := range tags {
		if err := attach(t.Dev, pushProgram(t.VID, t.Subnet), ebpf.AttachTCXEgress); err != nil {
			return nil, errors.Join(fmt.Errorf("lab: vlan %s: %w", t, err), closeAll())
		}
		if !popped[t.Dev] {
			popped[t.Dev] = true
			if err := attach(t.Dev, popProgram(), ebpf.AttachTCXIngress); err != nil {
				return nil, errors.Join(fmt.Errorf("lab: vlan %s: %w", t, err), closeAll())
			}
		}
	}
	return closeAll, nil
}
