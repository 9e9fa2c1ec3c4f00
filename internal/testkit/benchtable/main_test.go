package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
pkg: github.com/tapflow/tapflow/bpf/source
BenchmarkDecode-2      	  100	   106.0 ns/rec
BenchmarkAgentUserspace-2 	3	0.03 binary_allocs/record	1637 binary_cpu_ns/record	1732 text_cpu_ns/record	0 ns/op
pkg: github.com/tapflow/tapflow/schemas
BenchmarkDecode-2      	  100	   999.0 ns/op
BenchmarkPipelineParquet-2      	       3	         0 ns/op	        31.50 disk-B/record	    400000 records/cpu-s	    500000 records/s
BenchmarkPipelineParquetRows-2  	       3	         0 ns/op	        31.60 disk-B/record	    200000 records/cpu-s	    250000 records/s
BenchmarkPipelineJSONLines-2    	       3	         0 ns/op	       600.0 disk-B/record	    100000 records/cpu-s	    120000 records/s
BenchmarkPerPacket/hit-2        	     100	        70.00 ns/pkt	        11.00 empty_ns/pkt	         6.36 x_empty
pkg: github.com/tapflow/tapflow/bpf/source
BenchmarkAgentWireForms-2 	3	311.0 lz4_narrow_cpu_ns/record	247.0 none_narrow_cpu_ns/record	0 ns/op
pkg: github.com/tapflow/tapflow/internal/app
BenchmarkAgentLive/rate=100k/codec=lz4-2         	       1	         0.2090 cores	      2091 cpu_ns/record	     99925 records/s	       122.4 rss_hwm_MiB	       122.7 rss_max_MiB	        48.90 stream_B/record
BenchmarkAgentLive/rate=200k/codec=lz4-2         	       1	         0.07000 allocs/record	         0.09000 cores	      450.0 cpu_ns/record	    199871 records/s	       140.0 rss_hwm_MiB	       121.3 rss_max_MiB	        47.29 stream_B/record
BenchmarkAgentLive/rate=200k/codec=none-2        	       1	         0.2845 cores	      1418 cpu_ns/record	    200696 records/s	       135.9 rss_hwm_MiB	       132.8 rss_max_MiB	       136.2 stream_B/record
PASS
`

// TestAgentLiveRows: issue 24 item 7's rows read BenchmarkAgentLive's
// sub-benchmarks (names with slashes and '=', the -N suffix dropped)
// beside the in-process floor of the same codec, and check the goals.
func TestAgentLiveRows(t *testing.T) {
	all := map[string]result{}
	if err := parse(strings.NewReader(sample), all); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	render(&out, all)
	rows := map[string]string{}
	for l := range strings.Lines(out.String()) {
		if name, _, ok := strings.Cut(l, "  "); ok {
			rows[name] = strings.Join(strings.Fields(l[len(name):]), " ")
		}
	}
	for _, tc := range []struct {
		row  string
		want string // the row's columns after the name, single-spaced
	}{
		{"agent live, cpu ns/record at 200k records/s, lz4 (vs the in-process path)",
			"450 311 1.45x <= 500 yes BenchmarkAgentLive/rate=200k/codec=lz4 (cpu_ns/record)"},
		{"agent live, cpu ns/record at 100k records/s, lz4 (vs the in-process path)",
			"2091 311 6.72x <= 500 NO BenchmarkAgentLive/rate=100k/codec=lz4 (cpu_ns/record)"},
		{"agent live, cpu ns/record at 200k records/s, codec none (vs the in-process path)",
			"1418 247 5.74x <= 250 NO BenchmarkAgentLive/rate=200k/codec=none (cpu_ns/record)"},
		{"agent live, allocs/record at 200k records/s, lz4 (whole process vs the in-process path)",
			"0.07 0.03 2.33x BenchmarkAgentLive/rate=200k/codec=lz4 (allocs/record)"},
		{"agent live, records/s published at 200k requested, lz4",
			"199.9k >= 180.0k yes BenchmarkAgentLive/rate=200k/codec=lz4 (records/s)"},
		{"agent live, RSS MiB at 200k records/s, lz4 (max of 1 s samples)",
			"121 <= 128 yes BenchmarkAgentLive/rate=200k/codec=lz4 (rss_max_MiB)"},
		{"agent live, VmHWM MiB at 200k records/s, lz4 (peak)",
			"140 <= 128 NO BenchmarkAgentLive/rate=200k/codec=lz4 (rss_hwm_MiB)"},
		{"agent live, VmHWM MiB at 200k records/s, codec none (peak)",
			"136 <= 128 NO BenchmarkAgentLive/rate=200k/codec=none (rss_hwm_MiB)"},
	} {
		if got, ok := rows[tc.row]; !ok {
			t.Errorf("no row %q:\n%s", tc.row, out.String())
		} else if got != tc.want {
			t.Errorf("row %q:\n got %s\nwant %s", tc.row, got, tc.want)
		}
	}
}

func TestTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string // substrings of the output, in any order
	}{
		{"figures with baselines", sample, []string{
			"400.0k",
			"4.00x", "ratio >= 3.00", "2.00x",
			"kernel hit, ns over the empty tc program", "59.00",
			"kernel hit, x_empty", "6.36",
			"  106  ", // bpf/source:BenchmarkDecode, not schemas' (999)
			"agent userspace ns/record", "1637", "1732", "0.95x", "<= 200",
		}},
		{"nothing ran", "PASS\n", []string{"not run"}},
		{"garbage lines are skipped", "BenchmarkX-2 notanumber 3 ns/op\nBenchmark\n", []string{"not run"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := map[string]result{}
			if err := parse(strings.NewReader(tc.in), all); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			render(&out, all)
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
	all := map[string]result{}
	_ = parse(strings.NewReader(sample), all)
	var out strings.Builder
	render(&out, all)
	if strings.Contains(out.String(), "999") {
		t.Errorf("schemas' BenchmarkDecode taken for bpf/source's:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "NO") || !strings.Contains(out.String(), "yes") {
		t.Errorf("goal column: want both a met (ratio 4 >= 3) and a missed goal (x_empty 6.36 > 2.5):\n%s", out.String())
	}
}
