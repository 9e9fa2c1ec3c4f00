//go:build linux

package bpf

import (
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// FuzzProgram feeds random and mutated frames through BPF_PROG_TEST_RUN:
// the verdict is always TC_ACT_UNSPEC, every frame is metered exactly once
// (as IP or as skipped), and Σ bytes in the table + ring + lost always equal
// the metered IP bytes. `go test` runs the seeds; `go test -fuzz
// FuzzProgram ./bpf` explores.
func FuzzProgram(f *testing.F) {
	seeds := [][]byte{
		eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, tcp(1, 2, 0x12, nil))),
		eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{options: pad(8), mf: true}, udp(1, 2, pad(30)))),
		vlanEth(macB, macA, 5, 0x86dd, ipv6("fd00::1", "fd00::2", 0, ext6(44, 0, frag6(6, 0, true, tcp(1, 2, 0x01, nil))))),
		eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 51, ah6(58, icmp(128, 0, nil)))),
		eth(macB, macA, 0x0806, pad(28)),
		pad(14),
	}
	for _, s := range seeds {
		f.Add(s, true)
	}
	var o *Objects
	var rd *ringbuf.Reader
	var rec ringbuf.Record
	f.Fuzz(func(t *testing.T, frame []byte, ingress bool) {
		if len(frame) < 14 || len(frame) > 3500 {
			return // outside what BPF_PROG_TEST_RUN accepts
		}
		if o == nil {
			prereq.Root(t, "to load eBPF")
			var err error
			if o, err = Load(Spec{FlowEntries: 64, RingBytes: 1 << 16, Interfaces: 2, ActiveTimeout: time.Hour}); err != nil {
				t.Fatal(err)
			}
			o.SetSlot(loIfindex, 1)
			if rd, err = ringbuf.NewReader(o.Records()); err != nil {
				t.Fatal(err)
			}
		}
		dir, p := DirTX, o.Ingress()
		if !ingress {
			dir, p = DirRX, o.Egress()
		}
		m0, _ := o.ReadMeter(1, dir)
		ret, err := p.Run(&ebpf.RunOptions{Data: frame})
		if errors.Is(err, unix.EINVAL) {
			return // the kernel refused the frame before the program (short IP header)
		}
		if err != nil {
			t.Fatal(err)
		}
		if int32(ret) != -1 {
			t.Fatalf("verdict %d", int32(ret))
		}
		m1, _ := o.ReadMeter(1, dir)
		if (m1.Packets-m0.Packets)+(m1.SkippedPackets-m0.SkippedPackets) != 1 ||
			(m1.Bytes-m0.Bytes)+(m1.SkippedBytes-m0.SkippedBytes) != uint64(len(frame)) {
			t.Fatalf("frame metered wrong: before %+v after %+v", m0, m1)
		}
		// Conservation over everything so far: table + ring-so-far + lost.
		var inTable uint64
		fl, err := o.Flows()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fl {
			inTable += f.Val.Bytes
		}
		rd.SetDeadline(time.Unix(1, 0))
		for {
			if err := rd.ReadInto(&rec); err != nil {
				break
			}
			r, _ := DecodeRecord(rec.RawSample)
			ringBytes += r.Val.Bytes
		}
		var metered, lost uint64
		for _, d := range []Direction{DirTX, DirRX} {
			m, _ := o.ReadMeter(1, d)
			metered += m.Bytes
			lost += m.LostBytes
		}
		if inTable+ringBytes+lost != metered {
			t.Fatalf("table %d + ring %d + lost %d != metered %d", inTable, ringBytes, lost, metered)
		}
	})
}

var ringBytes uint64 // records drained by FuzzProgram so far (one process, one table)
