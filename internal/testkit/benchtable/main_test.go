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
PASS
`

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
