// Package attach puts the capture programs on both directions of an
// interface: with tcx links (kernel ≥ 6.6) or, when tcx is unavailable or
// forced, with a clsact qdisc and cls_bpf filters in direct-action mode.
//
// tcx links belong to the process: when it dies the kernel detaches them —
// unless they are pinned (New with a link directory on bpffs): then they
// stay attached, and the next run adopts a pinned link of the interface
// by swapping its own program in (link update: atomic). Handle.Keep
// leaves an attachment in place, Handle.Close detaches (and unpins).
// cls_bpf filters outlive the process anyway; without pinning RemoveStale
// deletes filters a previous run left behind (recognised by their name,
// FilterName*), with pinning they are replaced in place.
package attach
