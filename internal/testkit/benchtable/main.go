// Command benchtable prints the figures of `make bench` as one table:
// each figure with its baseline from the same run (the JSON-lines
// pipeline, the empty tc program, today's record path where it is kept),
// the ratio and the goal, so a regression shows at a glance. It reads
// the output of `go test -bench` (files named on the command line, or
// stdin); a benchmark that did not run shows as "not run".
//
//	go run ./internal/testkit/benchtable bench.txt
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
)

// result is one benchmark line: metric unit → value.
type result map[string]float64

// ref names one metric of one benchmark: its name without the -N
// GOMAXPROCS suffix, or pkg:name (pkg relative to the module, as
// bpf/source) where two packages share a benchmark name. With minus set, the value is metric − minus (a
// cost over a baseline measured in the same benchmark).
type ref struct {
	bench, metric, minus string
}

// figure is one row of the table.
type figure struct {
	name     string
	value    ref
	baseline *ref
	// goal is checked against the value (ratio false) or the ratio to
	// the baseline (ratio true); nil: shown for information.
	goal  *goal
	ratio bool
}

type goal struct {
	op   string // >= or <=
	want float64
}

func (g *goal) String() string { return g.op + " " + num(g.want) }

func (g *goal) met(v float64) bool {
	if g.op == ">=" {
		return v >= g.want
	}
	return v <= g.want
}

// figures are those of issue 16 (docs/architecture.md, performance).
var figures = []figure{
	{name: "end to end, records/cpu-s (Parquet vs JSON lines)",
		value:    ref{"BenchmarkPipelineParquet", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineJSONLines", "records/cpu-s", ""}, goal: &goal{">=", 3}, ratio: true},
	{name: "end to end, today's record path, records/cpu-s",
		value:    ref{"BenchmarkPipelineParquetRows", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineJSONLines", "records/cpu-s", ""}},
	{name: "end to end, columns vs record path",
		value:    ref{"BenchmarkPipelineParquet", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineParquetRows", "records/cpu-s", ""}},
	{name: "end to end, Parquet B/record on disk",
		value:    ref{"BenchmarkPipelineParquet", "disk-B/record", ""},
		baseline: &ref{"BenchmarkPipelineJSONLines", "disk-B/record", ""}, goal: &goal{"<=", 40}},
	{name: "collector, rows/cpu-s (columns vs records)",
		value:    ref{"BenchmarkCollectorRSS/columns/edge=2", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorRSS/edge=2", "records/cpu-s", ""}, goal: &goal{">=", 1.5e6}},
	{name: "collector on lz4 messages (the default codec) vs records on zstd",
		value:    ref{"BenchmarkCollectorRSS/columns-lz4/edge=2", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorRSS/edge=2", "records/cpu-s", ""}, goal: &goal{">=", 1.5e6}},
	{name: "collector, peak RSS MiB (columns vs records)",
		value:    ref{"BenchmarkCollectorRSS/columns/edge=2", "peak-RSS-MiB", ""},
		baseline: &ref{"BenchmarkCollectorRSS/edge=2", "peak-RSS-MiB", ""}},
	{name: "collector, B/record on disk (8 hours per message)",
		value:    ref{"BenchmarkCollectorRSS/columns/edge=2", "B/record", ""},
		baseline: &ref{"BenchmarkCollectorRSS/edge=2", "B/record", ""}},
	{name: "collector by page compression, records/cpu-s (snappy vs zstd)",
		value:    ref{"BenchmarkCollectorWriter/compression=snappy", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorWriter/compression=zstd", "records/cpu-s", ""}},
	{name: "collector by page compression, records/cpu-s (none vs zstd)",
		value:    ref{"BenchmarkCollectorWriter/compression=none", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorWriter/compression=zstd", "records/cpu-s", ""}},
	{name: "collector by page compression, B/record (snappy vs zstd)",
		value:    ref{"BenchmarkCollectorWriter/compression=snappy", "B/record", ""},
		baseline: &ref{"BenchmarkCollectorWriter/compression=zstd", "B/record", ""}},
	{name: "collector, peak RSS MiB at the default settings (8 hours open)",
		value: ref{"BenchmarkCollectorRSS/columns-lz4/edge=2", "peak-RSS-MiB", ""}, goal: &goal{"<=", 1024}},
	{name: "Parquet sink alone, records/cpu-s (zstd)",
		value:    ref{"BenchmarkParquetSink/zstd", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkJSONLinesSink", "records/cpu-s", ""}},
	{name: "Parquet column writers alone, parquet-go vs pqarrow",
		value:    ref{"BenchmarkColumnWriter/parquet-go", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkColumnWriter/pqarrow", "records/cpu-s", ""}},
	{name: "Parquet sink alone, B/record (zstd)",
		value: ref{"BenchmarkParquetSink/zstd", "B/record", ""}, goal: &goal{"<=", 40}},
	{name: "agent userspace ns/record, ring → publish body (binary record vs text path)",
		value:    ref{"BenchmarkAgentUserspace", "binary_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkAgentUserspace", "text_cpu_ns/record", ""}, goal: &goal{"<=", 200}},
	{name: "agent userspace allocs/record (per-batch allocations, amortized)",
		value:    ref{"BenchmarkAgentUserspace", "binary_allocs/record", ""},
		baseline: &ref{"BenchmarkAgentUserspace", "text_allocs/record", ""}},
	{name: "agent userspace, wire encode stage ns/record (binary vs text)",
		value:    ref{"BenchmarkAgentUserspace", "binary_encode_ns/record", ""},
		baseline: &ref{"BenchmarkAgentUserspace", "text_encode_ns/record", ""}},
	{name: "agent, ring record decode, ns/record (binary vs text)",
		value:    ref{"bpf/source:BenchmarkDecode", "ns/rec", ""},
		baseline: &ref{"bpf/source:BenchmarkDecodeText", "ns/rec", ""}},
	{name: "agent, attribution of a record (node-local mix), cpu ns/record (binary vs text)",
		value:    ref{"BenchmarkEnrich/AttributeFlowVersus/node-local", "binary_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkEnrich/AttributeFlowVersus/node-local", "text_cpu_ns/record", ""}},
	{name: "agent, wire encode lz4, cpu ns/record (binary vs text)",
		value:    ref{"BenchmarkFlowEncode/lz4", "binary_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkFlowEncode/lz4", "text_cpu_ns/record", ""}},
	{name: "agent, wire encode (default lz4 vs zstd), cpu ns/record",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_enc_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "zstd_enc_cpu_ns/record", ""}},
	{name: "agent, wire encode none (the floor), cpu ns/record",
		value: ref{"BenchmarkWireCodec/cpu", "none_enc_cpu_ns/record", ""}},
	{name: "collector, decode into rows (lz4 vs zstd), cpu ns/record",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_dec_rows_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "zstd_dec_rows_cpu_ns/record", ""}},
	{name: "wire, B/record (lz4 vs zstd)",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_B/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "zstd_B/record", ""}},
	{name: "end to end by codec, records/cpu-s (lz4 vs zstd)",
		value:    ref{"BenchmarkPipelineCodec/lz4", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineCodec/zstd", "records/cpu-s", ""}},
	{name: "end to end by codec, records/cpu-s (none vs zstd)",
		value:    ref{"BenchmarkPipelineCodec/none", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineCodec/zstd", "records/cpu-s", ""}},
	{name: "wire dictionaries: collector on lz4, dictionary vs plain utf8 strings",
		value:    ref{"BenchmarkCollectorRSS/columns-lz4/edge=2", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorRSS/columns-lz4-plain/edge=2", "records/cpu-s", ""}},
	{name: "wire dictionary indices into Parquet pages: collector on one agent's feed, records/cpu-s (indices vs values)",
		value:    ref{"BenchmarkCollectorDictIndices/agent/indices", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorDictIndices/agent/values", "records/cpu-s", ""}, goal: &goal{">=", 1.2e6}},
	{name: "wire dictionary indices into Parquet pages: collector on one agent's feed, allocated B/record (indices vs values)",
		value:    ref{"BenchmarkCollectorDictIndices/agent/indices", "alloc_B/record", ""},
		baseline: &ref{"BenchmarkCollectorDictIndices/agent/values", "alloc_B/record", ""}, goal: &goal{"<=", 40}},
	{name: "wire dictionary indices into Parquet pages: 200 nodes and 8 hours per message, records/cpu-s (indices vs values)",
		value:    ref{"BenchmarkCollectorDictIndices/spread/indices", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkCollectorDictIndices/spread/values", "records/cpu-s", ""}},
	{name: "wire dictionaries: agent encode lz4, cpu ns/record (dict vs plain)",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_enc_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "lz4-plain_enc_cpu_ns/record", ""}},
	{name: "wire dictionaries: decode into rows lz4, cpu ns/record (dict vs plain)",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_dec_rows_cpu_ns/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "lz4-plain_dec_rows_cpu_ns/record", ""}},
	{name: "wire dictionaries: B/record lz4 (dict vs plain)",
		value:    ref{"BenchmarkWireCodec/cpu", "lz4_B/record", ""},
		baseline: &ref{"BenchmarkWireCodec/cpu", "lz4-plain_B/record", ""}},
	{name: "wire dictionaries: end to end lz4, records/cpu-s (dict vs plain)",
		value:    ref{"BenchmarkPipelineCodec/lz4", "records/cpu-s", ""},
		baseline: &ref{"BenchmarkPipelineCodec/lz4-plain", "records/cpu-s", ""}},
	{name: "kernel hit, ns over the empty tc program",
		value: ref{"BenchmarkPerPacket/hit", "ns/pkt", "empty_ns/pkt"}, goal: &goal{"<=", 15}},
	{name: "kernel hit, x_empty",
		value: ref{"BenchmarkPerPacket/hit", "x_empty", ""}, goal: &goal{"<=", 2.5}},
	{name: "swap barrier, ms per export of 100k live flows (vs the idle sweep of that table)",
		value:    ref{"BenchmarkExportLive/flows=100000", "ms/export", ""},
		baseline: &ref{"BenchmarkExportLive/flows=100000/sweep=idle", "ms/export", ""}},
	{name: "kernel hit, NetObserv's net cost over this",
		value: ref{"BenchmarkPerPacketVersus", "netobserv_net_over_this", ""}, goal: &goal{">=", 3}},
	{name: "freshness p50 s, flow end → committed Parquet (roll_age 30s vs the default 5m)",
		value:    ref{"BenchmarkFreshness/roll_age=30s", "p50_s", ""},
		baseline: &ref{"BenchmarkFreshness/defaults", "p50_s", ""}},
	{name: "freshness p99 s, flow end → committed Parquet (roll_age 30s vs the default 5m)",
		value:    ref{"BenchmarkFreshness/roll_age=30s", "p99_s", ""},
		baseline: &ref{"BenchmarkFreshness/defaults", "p99_s", ""}},
	// issue 22 item 8: an agent's inventory (1,000,000 ports, fleet shape)
	{name: "agent inventory, bytes held per port (1M ports)",
		value: ref{"BenchmarkAgentInventoryMemory", "B/port", ""}, goal: &goal{"<=", 1024}},
	{name: "agent inventory, peak RSS MiB during a swap (1M ports)",
		value: ref{"BenchmarkAgentInventoryMemory", "swap-peak-RSS-MiB", ""}},
	// issue 24 item 7: the agent live (the tapflow agent process, synthetic
	// source, a nats-server of its own; BenchmarkAgentLive) beside the
	// in-process floor of the same codec (BenchmarkAgentWireForms' narrow
	// path: ring records → publish body, no process, no NATS).
	{name: "agent live, cpu ns/record at 200k records/s, lz4 (vs the in-process path)",
		value:    ref{"BenchmarkAgentLive/rate=200k/codec=lz4", "cpu_ns/record", ""},
		baseline: &ref{"BenchmarkAgentWireForms", "lz4_narrow_cpu_ns/record", ""}, goal: &goal{"<=", 500}},
	{name: "agent live, cpu ns/record at 100k records/s, lz4 (vs the in-process path)",
		value:    ref{"BenchmarkAgentLive/rate=100k/codec=lz4", "cpu_ns/record", ""},
		baseline: &ref{"BenchmarkAgentWireForms", "lz4_narrow_cpu_ns/record", ""}, goal: &goal{"<=", 500}},
	{name: "agent live, cpu ns/record at 200k records/s, codec none (vs the in-process path)",
		value:    ref{"BenchmarkAgentLive/rate=200k/codec=none", "cpu_ns/record", ""},
		baseline: &ref{"BenchmarkAgentWireForms", "none_narrow_cpu_ns/record", ""}, goal: &goal{"<=", 250}},
	{name: "agent live, allocs/record at 200k records/s, lz4 (whole process vs the in-process path)",
		value:    ref{"BenchmarkAgentLive/rate=200k/codec=lz4", "allocs/record", ""},
		baseline: &ref{"BenchmarkAgentUserspace", "binary_allocs/record", ""}},
	{name: "agent live, records/s published at 200k requested, lz4",
		value: ref{"BenchmarkAgentLive/rate=200k/codec=lz4", "records/s", ""}, goal: &goal{">=", 180e3}},
	{name: "agent live, RSS MiB at 200k records/s, lz4 (max of 1 s samples)",
		value: ref{"BenchmarkAgentLive/rate=200k/codec=lz4", "rss_max_MiB", ""}, goal: &goal{"<=", 128}},
	{name: "agent live, VmHWM MiB at 200k records/s, lz4 (peak)",
		value: ref{"BenchmarkAgentLive/rate=200k/codec=lz4", "rss_hwm_MiB", ""}, goal: &goal{"<=", 128}},
	{name: "agent live, VmHWM MiB at 200k records/s, codec none (peak)",
		value: ref{"BenchmarkAgentLive/rate=200k/codec=none", "rss_hwm_MiB", ""}, goal: &goal{"<=", 128}},
}

// issue 24 item 5: the kernel program with its flow cache against the same
// program with the cache off (the table alone), 1 to 65,536 live flows,
// one packet per visit and bursts of 64 (BenchmarkPerPacket's sweep): the
// cache must never cost more than the table.
func init() {
	for _, flows := range []int{1, 16, 256, 1024, 4096, 16384, 65536} {
		for _, burst := range []int{1, 64} {
			bench := fmt.Sprintf("BenchmarkPerPacket/flows=%d/burst=%d", flows, burst)
			figures = append(figures, figure{
				name:     fmt.Sprintf("kernel ns/pkt, %d flows, burst %d (flow cache vs table alone)", flows, burst),
				value:    ref{bench, "this_ns/pkt", ""},
				baseline: &ref{bench, "table_ns/pkt", ""}, goal: &goal{"<=", 1}, ratio: true})
		}
	}
}

const module = "github.com/tapflow/tapflow"

var procSuffix = regexp.MustCompile(`-\d+$`)

// parse reads benchmark lines: name, iterations, then value-unit pairs.
// A benchmark seen more than once keeps its last line.
func parse(r io.Reader, into map[string]result) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pkg := ""
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "pkg: "); ok {
			pkg = strings.TrimPrefix(strings.TrimSpace(p), module+"/")
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		res := result{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			res[f[i+1]] = v
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		into[name] = res
		into[pkg+":"+name] = res
	}
	return sc.Err()
}

func (r ref) get(all map[string]result) (float64, bool) {
	res, ok := all[r.bench]
	if !ok {
		return 0, false
	}
	v, ok := res[r.metric]
	if !ok {
		return 0, false
	}
	if r.minus != "" {
		m, ok := res[r.minus]
		if !ok {
			return 0, false
		}
		v -= m
	}
	return v, true
}

func num(v float64) string {
	switch a := max(v, -v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func render(w io.Writer, all map[string]result) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\tratio\tgoal\tmet\tbenchmark (metric)")
	for _, f := range figures {
		v, ok := f.value.get(all)
		src := f.value.bench + " (" + f.value.metric + ")"
		if !ok {
			fmt.Fprintf(tw, "%s\tnot run\t\t\t%s\t\t%s\n", f.name, goalText(f), src)
			continue
		}
		base, ratio, met := "", "", ""
		r := 0.0
		haveRatio := false
		if f.baseline != nil {
			if b, ok := f.baseline.get(all); ok {
				base = num(b)
				if b != 0 {
					r, haveRatio = v/b, true
					ratio = strconv.FormatFloat(r, 'f', 2, 64) + "x"
				}
			} else {
				base = "not run"
			}
		}
		if f.goal != nil {
			switch {
			case !f.ratio:
				met = yesNo(f.goal.met(v))
			case haveRatio:
				met = yesNo(f.goal.met(r))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.name, num(v), base, ratio, goalText(f), met, src)
	}
	tw.Flush()
}

func goalText(f figure) string {
	if f.goal == nil {
		return ""
	}
	if f.ratio {
		return "ratio " + f.goal.String()
	}
	return f.goal.String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func main() {
	all := map[string]result{}
	if len(os.Args) < 2 {
		if err := parse(os.Stdin, all); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
	}
	for _, p := range os.Args[1:] {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchtable: %v (run make bench, which writes it)\n", err)
			os.Exit(1)
		}
		err = parse(f, all)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchtable: %s: %v\n", p, err)
			os.Exit(1)
		}
	}
	render(os.Stdout, all)
}
