// Package capture runs tapflow's kernel capture: it loads the flow program
// (package bpf) sized from Config, attaches it to every interface matching
// Config.Interfaces as they appear (netlink events plus a periodic presence
// scan), drains the ring buffer on a timer, sweeps idle flows, publishes
// meters, and at every stop exports every flow still in the kernel (flow
// tables and every CPU's flow cache) as a `shutdown` record. Without
// Config.PinDir, or with a pin whose bpffs will not outlive the agent
// (bpf.PinDurable: a private mount namespace), the stop detaches first;
// with a durable pin the programs stay attached and the kernel state
// pinned, and the next run adopts what they counted meanwhile (see
// bpf/pin.go). Ring-buffer records are consumed only once the Handler
// reports them durable (done), so a killed agent loses nothing the kernel
// held: the next run reads again what was not durable. What a stop must
// let go of with nothing to adopt it is counted (stranded records).
//
// Everything runs in one goroutine (Run); the Handler it calls may block,
// which is the backpressure: the ring buffer then fills and the kernel
// counts what it could not export (lost_packets / lost_bytes).
//
// Why netlink and a scan: the netlink subscription attaches a new tap within
// milliseconds of RTM_NEWLINK, before the VM sends its first frame; the scan
// (rescan_interval) repairs anything a lost netlink message (ENOBUFS under a
// burst of port creations) or a failed attach left behind.
package capture
