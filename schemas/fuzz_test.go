package schemas

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime/metrics"
	"testing"
	"time"
)

// The wire decoders' fuzz targets: flow.v1 and meter.v1 messages as the
// collector receives them, decoded into records (tapflow tap, DLQ
// inspection) and into rows (the collector). Seeds: every wire codec ×
// both string forms (dictionary, plain), and the hostile messages of
// hostile_test.go (issue 22's crashers, rebuilt). Each input must decode
// or fail with ErrCorrupt/ErrTooLarge, never panic; decoded rows must be
// readable (the collector reads them after Decode returns) and equal the
// records decoded from the same bytes; and decoding must allocate about
// the budget at most. `make fuzz` runs them for FUZZTIME each; make test
// for a few seconds (test-fuzz).

const (
	fuzzBudget  = 4 << 20
	fuzzRecords = 4096
	fuzzHang    = 10 * time.Second
)

func FuzzWireFlow(f *testing.F)      { fuzzWire(f, FlowTable, FlowRows, false) }
func FuzzWireFlowRows(f *testing.F)  { fuzzWire(f, FlowTable, FlowRows, true) }
func FuzzWireMeter(f *testing.F)     { fuzzWire(f, MeterTable, MeterRows, false) }
func FuzzWireMeterRows(f *testing.F) { fuzzWire(f, MeterTable, MeterRows, true) }

func fuzzWire[T any](f *testing.F, tab *Table[T], rowTab *Table[Row], rowsForm bool) {
	for _, s := range wireSeeds(f, tab) {
		f.Add(s)
	}
	recDec, err := NewDecoderFor(tab).Limited(fuzzBudget, fuzzRecords)
	if err != nil {
		f.Fatal(err)
	}
	rowDec, err := NewDecoderFor(rowTab).Limited(fuzzBudget, fuzzRecords)
	if err != nil {
		f.Fatal(err)
	}
	pool := NewBufferPool(fuzzBudget).Poisoned()
	pooledDec := rowDec.WithPool(pool)
	f.Fuzz(func(t *testing.T, body []byte) {
		// A decode that hangs is a crasher too: the fuzzer keeps an input
		// whose worker dies.
		hang := time.AfterFunc(fuzzHang, func() {
			if dir := os.Getenv("TAPFLOW_FUZZ_HANG_DIR"); dir != "" {
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("hang-%x", sha256.Sum256(body))), body, 0o644)
			}
			panic(fmt.Sprintf("decoding a %d-byte message took over %s", len(body), fuzzHang))
		})
		defer hang.Stop()
		before := heapAllocated()
		recs, rerr := recDec.Decode(nil, body)
		if rerr != nil && !errors.Is(rerr, ErrCorrupt) && !errors.Is(rerr, ErrTooLarge) {
			t.Fatalf("records: error %v wraps neither ErrCorrupt nor ErrTooLarge", rerr)
		}
		if len(recs) > fuzzRecords {
			t.Fatalf("records: %d decoded, limit %d", len(recs), fuzzRecords)
		}
		if rowsForm {
			rows, werr := rowDec.Decode(nil, body)
			if werr != nil && !errors.Is(werr, ErrCorrupt) && !errors.Is(werr, ErrTooLarge) {
				t.Fatalf("rows: error %v wraps neither ErrCorrupt nor ErrTooLarge", werr)
			}
			if (rerr == nil) != (werr == nil) {
				t.Fatalf("records and rows decoders disagree: %v / %v", rerr, werr)
			}
			if werr == nil {
				readRows(rows) // must not panic
				if len(rows) != len(recs) {
					t.Fatalf("%d rows, %d records", len(rows), len(recs))
				}
				if len(rows) > 0 {
					rec := rowTab.ToArrow(rows)
					back, err := tab.FromArrow(rec, nil)
					rec.Release()
					if err != nil || !reflect.DeepEqual(back, recs) {
						t.Fatalf("rows re-encoded differ from the records (%v)", err)
					}
				}
			}
		}
		// The budget, a zstd frame's decompressed copy (at most the
		// budget again), the decoded records and their strings.
		bound := uint64(4*fuzzBudget + 64*len(body) + 2048*len(recs) + 1<<20)
		if rowsForm {
			bound *= 2
		}
		if grown := heapAllocated() - before; grown > bound {
			t.Fatalf("decoding a %d-byte message allocated %d bytes, more than %d (budget %d)", len(body), grown, bound, fuzzBudget)
		}
		if rowsForm {
			// From recycled (poisoned) buffers: the same rows, and
			// nothing left held by the pool once released, whatever the
			// decode's outcome.
			rows, perr := pooledDec.Decode(nil, body)
			if (perr == nil) != (rerr == nil) {
				t.Fatalf("pooled and records decoders disagree: %v / %v", perr, rerr)
			}
			if perr == nil && len(rows) > 0 {
				rec := rowTab.ToArrow(rows)
				back, err := tab.FromArrow(rec, nil)
				rec.Release()
				if err != nil || !reflect.DeepEqual(back, recs) {
					t.Fatalf("pooled rows differ from the records (%v)", err)
				}
			}
			ReleaseRows(rows)
			if st := pool.Stats(); st.Messages != 0 || st.Out != 0 {
				t.Fatalf("pool holds %d messages (%d bytes) after a decode (%v) and its release", st.Messages, st.Out, perr)
			}
		}
	})
}

var heapSample = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

// heapAllocated is the bytes allocated on the heap so far (cheap: no
// stop of the world, unlike runtime.ReadMemStats).
func heapAllocated() uint64 {
	metrics.Read(heapSample)
	return heapSample[0].Value.Uint64()
}

// wireSeeds are valid messages of tab's schema in every codec and every
// string form (narrow and int32 dictionary indices, plain utf8), and the
// hostile messages (flow messages: on the meter decoders they exercise
// the same structure checks).
func wireSeeds[T any](tb testing.TB, tab *Table[T]) [][]byte {
	var out [][]byte
	for _, codec := range Codecs {
		for _, form := range []wireForm{formDict, formWide, formPlain} {
			for _, n := range []int{1, 20} {
				var body []byte
				var err error
				switch any(tab).(type) {
				case *Table[Meter]:
					e, _ := NewEncoderFor(MeterTable, codec)
					body, err = e.withForm(form).Encode(nil, sampleMeters(n))
				default:
					e, _ := NewEncoder(codec)
					body, err = e.withForm(form).Encode(nil, wireFlows(n))
				}
				if err != nil {
					tb.Fatal(err)
				}
				out = append(out, body)
			}
		}
	}
	for _, h := range hostileMessages {
		out = append(out, h.build(tb))
	}
	return out
}
