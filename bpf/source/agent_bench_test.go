package source

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
)

// ringBatches turns n batches of the synthetic source's raw records (the
// default cloud and traffic mix) into kernel records, as the ring buffer
// hands them to the source: MACs and IPs as bytes in wire order.
func ringBatches(b *testing.B, n int) ([][]capture.Record, *synthetic.Source) {
	cfg := synthetic.DefaultConfig()
	cfg.RecordsPerSecond = 0
	src, err := synthetic.New(cfg, synthetic.Options{Node: "cmp-17", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *pipeline.Batch, 1)
	go func() { _ = src.Run(ctx, out); close(out) }()
	var batches [][]capture.Record
	for bt := range out {
		if len(batches) < n {
			recs := make([]capture.Record, len(bt.Records))
			for i := range bt.Records {
				recs[i] = toRing(b, &bt.Records[i])
			}
			batches = append(batches, recs)
		} else {
			cancel()
		}
		bt.Ack(nil)
	}
	return batches, src
}

func toRing(b *testing.B, f *schemas.Flow) capture.Record {
	var r capture.Record
	k := &r.Key
	vm, ok1 := schemas.ParseMAC(f.VMMAC)
	peer, ok2 := schemas.ParseMAC(f.PeerMAC)
	src, err1 := netip.ParseAddr(f.SrcIP)
	dst, err2 := netip.ParseAddr(f.DstIP)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		b.Fatalf("synthetic record not convertible: %+v", *f)
	}
	unpack := func(v uint64) (m [6]byte) {
		for i := range m {
			m[i] = byte(v >> (40 - 8*i))
		}
		return m
	}
	k.Direction = uint8(bpf.DirTX)
	k.SrcMac, k.DstMac = unpack(vm), unpack(peer)
	if f.Direction == "rx" {
		k.Direction = uint8(bpf.DirRX)
		k.SrcMac, k.DstMac = k.DstMac, k.SrcMac
	}
	k.EthProto = 0x0800
	if src.Is6() {
		k.EthProto = 0x86dd
	}
	k.SrcIp, k.DstIp = netip.AddrFrom16(src.As16()).As16(), netip.AddrFrom16(dst.As16()).As16()
	if src.Is4() {
		k.SrcIp, k.DstIp = netip.AddrFrom4(src.As4()).As16(), netip.AddrFrom4(dst.As4()).As16()
	}
	k.Protocol, k.SrcPort, k.DstPort = uint8(f.Protocol), uint16(f.SrcPort), uint16(f.DstPort)
	r.Val.Packets, r.Val.Bytes, r.Val.TcpFlags = uint64(f.Packets), uint64(f.Bytes), uint32(f.TCPFlags)
	r.Ifname = f.Ifname
	r.TimeStart, r.TimeEnd = f.TimeStart, f.TimeEnd
	r.EndReason = uint8(bpf.EndActiveTimeout)
	return r
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// agentPath is one way through the agent's userspace: the source's batch
// (Source.Flows), the enrich stage (Engine.Apply, late binding on), the
// publisher's stamp and wire encode (default codec lz4) into a reused
// body. The NATS publish itself is not in it (BenchmarkPipelineParquet
// has it, with the server in the same process).
type agentPath struct {
	name                  string
	decode                func(*capture.Record, *schemas.Flow)
	eng                   *enrich.Engine
	enc                   *schemas.Encoder
	arrays                *pipeline.Arrays[schemas.Flow]
	body                  []byte
	seq                   int64
	tAlloc, tDec, tAttr   time.Duration
	tEnc                  time.Duration
	allocs, recs, encoded int64
}

// newAgentPath is an agentPath with its own enrich engine over src's
// inventory and an encoder of codec (int32 dictionary indices if wide).
func newAgentPath(b *testing.B, src *synthetic.Source, name string, decode func(*capture.Record, *schemas.Flow), codec string, wide bool) *agentPath {
	eng, err := enrich.New(enrich.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry(), enrich.WithProvider(src.Provider()))
	if err != nil {
		b.Fatal(err)
	}
	if err := eng.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	enc, err := schemas.NewEncoder(codec)
	if err != nil {
		b.Fatal(err)
	}
	if wide {
		enc = enc.WideIndices()
	}
	return &agentPath{name: name, decode: decode, eng: eng, enc: enc, arrays: pipeline.NewArrays[schemas.Flow](pipeline.FreeArrays)}
}

// warmUp runs every path over the batches once (intern tables,
// late-binding buffer, body) and zeroes its figures.
func warmUp(b *testing.B, paths []*agentPath, batches [][]capture.Record) {
	for _, p := range paths {
		for _, bt := range batches {
			p.batch(b, bt)
		}
		p.tAlloc, p.tDec, p.tAttr, p.tEnc, p.recs, p.encoded = 0, 0, 0, 0, 0, 0
	}
}

func (p *agentPath) batch(b *testing.B, recs []capture.Record) {
	t0 := cpuNow()
	flows := p.arrays.Get(len(recs)) // as Source.Flows
	ta := cpuNow()
	for i := range recs {
		flows[i] = schemas.Flow{}
		p.decode(&recs[i], &flows[i])
	}
	bt := pipeline.NewBatch(flows, nil)
	t1 := cpuNow()
	if err := p.eng.Apply(context.Background(), bt); err != nil {
		b.Fatal(err)
	}
	t2 := cpuNow()
	p.seq++
	var err error // the batch's identity, as the publisher encodes it
	if p.body, err = p.enc.EncodeBatch(p.body[:0], bt.Records, schemas.Identity{AgentID: "agent-cmp-17", BatchSeq: p.seq}); err != nil {
		b.Fatal(err)
	}
	t3 := cpuNow()
	p.arrays.Put(flows) // as the ack of Source.Flows' batch
	p.tAlloc, p.tDec, p.tAttr, p.tEnc = p.tAlloc+ta-t0, p.tDec+t1-ta, p.tAttr+t2-t1, p.tEnc+t3-t2
	p.recs += int64(len(recs))
	p.encoded += int64(len(bt.Records))
}

// BenchmarkAgentUserspace: CPU ns and allocations per record of the agent
// from the ring buffer's records to the encoded message, for the binary
// working record (binary_*) and the former text path (text_*: the
// decoder formats MACs and IPs, attribution parses them back), both in
// each iteration over the same 8 batches of 16384 synthetic records, so
// both see the same load. Stage figures: taking the batch's
// []schemas.Flow (a recycled array, as Source.Flows takes it; each record
// is zeroed in the decode stage), decode, attribute, encode.
// Issue 16's goal is ≤ 200 ns and 0 allocations per record.
// TAPFLOW_BENCH_PATH=binary (or text) runs one path alone, to profile it.
func BenchmarkAgentUserspace(b *testing.B) {
	batches, src := ringBatches(b, 8)
	newPath := func(name string, decode func(*capture.Record, *schemas.Flow)) *agentPath {
		return newAgentPath(b, src, name, decode, schemas.CodecLZ4, false)
	}
	paths := []*agentPath{newPath("binary", NewDecoder("cmp-17").Decode), newPath("text", newTextDecoder("cmp-17").Decode)}
	if only := os.Getenv("TAPFLOW_BENCH_PATH"); only != "" { // one path alone, to profile it
		paths = slices.DeleteFunc(paths, func(p *agentPath) bool { return p.name != only })
		if len(paths) == 0 {
			b.Fatalf("TAPFLOW_BENCH_PATH=%s: want binary or text", only)
		}
	}
	warmUp(b, paths, batches)
	for b.Loop() {
		for _, p := range paths {
			for _, bt := range batches {
				m0 := mallocs()
				p.batch(b, bt)
				p.allocs += int64(mallocs() - m0)
			}
		}
	}
	for _, p := range paths {
		n := float64(p.recs)
		ns := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / n }
		b.ReportMetric(ns(p.tAlloc+p.tDec+p.tAttr+p.tEnc), p.name+"_cpu_ns/record")
		b.ReportMetric(ns(p.tAlloc), p.name+"_batch_alloc_ns/record")
		b.ReportMetric(ns(p.tDec), p.name+"_decode_ns/record")
		b.ReportMetric(ns(p.tAttr), p.name+"_attribute_ns/record")
		b.ReportMetric(ns(p.tEnc), p.name+"_encode_ns/record")
		b.ReportMetric(float64(p.allocs)/n, p.name+"_allocs/record")
	}
	if len(paths) == 2 {
		total := func(p *agentPath) float64 { return float64(p.tAlloc + p.tDec + p.tAttr + p.tEnc) }
		b.ReportMetric(total(paths[1])/total(paths[0]), "text_vs_binary")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAgentWireForms is BenchmarkAgentUserspace's binary path with
// each wire form of the dictionaries (narrow indices, the default, and
// the int32 indices of agents before them: WideIndices) at the default
// codec (lz4) and at none, all four in each iteration (in rotating
// order) over the same batches. <path>_encode_ns/record is the publisher's stamp and encode
// (CPU), <path>_cpu_ns/record the whole path, <path>_B/record the body.
func BenchmarkAgentWireForms(b *testing.B) {
	batches, src := ringBatches(b, 8)
	newPath := func(name, codec string, wide bool) *agentPath {
		return newAgentPath(b, src, name, NewDecoder("cmp-17").Decode, codec, wide)
	}
	paths := []*agentPath{
		newPath("lz4_narrow", schemas.CodecLZ4, false), newPath("lz4_wide", schemas.CodecLZ4, true),
		newPath("none_narrow", schemas.CodecNone, false), newPath("none_wide", schemas.CodecNone, true),
	}
	bodyBytes := make([]int64, len(paths))
	warmUp(b, paths, batches)
	order := []int{0, 1, 2, 3}
	for b.Loop() {
		// A path's GC debt lands on the next: each path follows each
		// other in turn.
		order = append(order[1:], order[0])
		for _, i := range order {
			for _, bt := range batches {
				paths[i].batch(b, bt)
				bodyBytes[i] += int64(len(paths[i].body))
			}
		}
	}
	for i, p := range paths {
		n := float64(p.recs)
		ns := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / n }
		b.ReportMetric(ns(p.tAlloc+p.tDec+p.tAttr+p.tEnc), p.name+"_cpu_ns/record")
		b.ReportMetric(ns(p.tEnc), p.name+"_encode_ns/record")
		b.ReportMetric(float64(bodyBytes[i])/n, p.name+"_B/record")
	}
	for i := 0; i < len(paths); i += 2 {
		b.ReportMetric(float64(paths[i].tEnc)/float64(paths[i+1].tEnc), paths[i].name+"_vs_wide_encode")
	}
	b.ReportMetric(0, "ns/op")
}
