//go:build linux

package bpf

import (
	"errors"
	"os"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

const loIfindex = 1 // BPF_PROG_TEST_RUN runs skbs on the netns loopback

// loadForTest loads fresh objects or skips when the machine cannot.
func loadForTest(tb testing.TB, s Spec) *Objects {
	tb.Helper()
	prereq.Root(tb, "CAP_BPF, CAP_NET_ADMIN to load eBPF programs")
	if s.FlowEntries == 0 {
		s.FlowEntries = 1024
	}
	if s.RingBytes == 0 {
		s.RingBytes = 1 << 20
	}
	if s.Interfaces == 0 {
		s.Interfaces = 8
	}
	if s.ActiveTimeout == 0 {
		s.ActiveTimeout = time.Hour
	}
	o, err := Load(s)
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			prereq.Require(tb, "a kernel that can run the capture", err, "a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y) and the eBPF features bpf.CheckKernel names")
		}
		tb.Fatalf("Load: %v", err)
	}
	tb.Cleanup(func() { o.Close() })
	pinCPU(tb)
	if err := o.SetSlot(loIfindex, 1); err != nil {
		tb.Fatal(err)
	}
	return o
}

// pinCPU keeps the calling goroutine on one CPU until the test ends.
// BPF_PROG_TEST_RUN runs the program on the caller's CPU, and a flow's
// packets sit in that CPU's flow cache: pinned, a test's packets share one
// cache as a flow on one queue does (records are exact either way; the
// multi-CPU test covers the split).
func pinCPU(tb testing.TB) {
	tb.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		tb.Fatalf("sched_getaffinity: %v", err)
	}
	for c := 0; c < 1024; c++ {
		if old.IsSet(c) {
			one.Set(c)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		tb.Fatalf("sched_setaffinity: %v", err)
	}
	tb.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// run feeds one frame to the program of dir and checks the verdict is
// "no opinion" (TC_ACT_UNSPEC / TCX_NEXT).
func run(tb testing.TB, o *Objects, dir Direction, frame []byte) {
	tb.Helper()
	p := o.Ingress()
	if dir == DirRX {
		p = o.Egress()
	}
	ret, err := p.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		tb.Fatalf("test run (%d bytes): %v", len(frame), err)
	}
	if int32(ret) != -1 {
		tb.Fatalf("verdict %d, want TC_ACT_UNSPEC (-1): the program must not decide", int32(ret))
	}
}

type entry struct {
	K FlowKey
	V FlowVal
}

func dumpFlows(tb testing.TB, o *Objects) []entry {
	tb.Helper()
	var out []entry
	fl, err := o.Flows()
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range fl {
		out = append(out, entry{f.Key, f.Val})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K.SrcPort < out[j].K.SrcPort })
	return out
}

// drainRing returns every record currently in the ring buffer.
func drainRing(tb testing.TB, o *Objects) []FlowRecord {
	tb.Helper()
	rd, err := ringbuf.NewReader(o.Records())
	if err != nil {
		tb.Fatalf("ringbuf reader: %v", err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Unix(1, 0))
	var out []FlowRecord
	var rec ringbuf.Record
	for {
		err := rd.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			tb.Fatalf("read ring: %v", err)
		}
		r, ok := DecodeRecord(rec.RawSample)
		if !ok {
			tb.Fatalf("short record: %d bytes", len(rec.RawSample))
		}
		out = append(out, *r)
	}
}

func meter(tb testing.TB, o *Objects, dir Direction) Meter {
	tb.Helper()
	m, err := o.ReadMeter(1, dir)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}
