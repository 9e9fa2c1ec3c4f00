// Package attach puts the capture programs on both directions of an
// interface: with tcx links (kernel ≥ 6.6) or, when tcx is unavailable or
// forced, with a clsact qdisc and cls_bpf filters in direct-action mode.
//
// tcx links belong to the process: when it dies the kernel detaches them.
// cls_bpf filters outlive it, so RemoveStale deletes filters a previous run
// left behind (they are recognised by their name, FilterName*).
package attach
