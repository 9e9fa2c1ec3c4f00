package schemas_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
)

var (
	realOnce  sync.Once
	realBatch []schemas.Flow
)

// realistic is one default-size batch (16384) of attributed synthetic
// records: the mix of tenants, zones, addresses and counters the agent
// publishes, stamped like the publisher stamps them.
func realistic(b testing.TB) []schemas.Flow {
	realOnce.Do(func() {
		cfg := synthetic.DefaultConfig()
		cfg.RecordsPerSecond, cfg.Attributed = 0, true
		src, err := synthetic.New(cfg, synthetic.Options{Node: "cmp-17", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *pipeline.Batch, 1)
		go func() { _ = src.Run(ctx, out); close(out) }()
		for bt := range out {
			if realBatch == nil {
				realBatch = bt.Records
				cancel()
			}
			bt.Ack(nil)
		}
		cancel()
		for i := range realBatch {
			realBatch[i].AgentID, realBatch[i].BatchSeq, realBatch[i].RecordIndex = "agent-cmp-17", 1_764_000_000_000_000, int32(i)
		}
	})
	return realBatch
}

// BenchmarkWireCodec measures every wire codec on one realistic batch:
// B/record on the wire, agent encode and collector decode time per
// record, and size_vs_none (the uncompressed Arrow stream of the same run
// is the baseline). The cpu sub-benchmark runs every codec in turn in
// each iteration and counts process CPU time, not wall time, so on a
// shared machine all codecs see the same load: its <codec>_enc and
// <codec>_dec metrics (CPU ns/record) and their ratios to none are the
// numbers to compare. `make bench`; results in docs/subscribers.md.
func BenchmarkWireCodec(b *testing.B) {
	recs := realistic(b)
	b.Run("cpu", func(b *testing.B) { benchCPU(b, recs) })
	enc, _ := schemas.NewEncoder(schemas.CodecNone)
	plain, err := enc.Encode(nil, recs)
	if err != nil {
		b.Fatal(err)
	}
	for _, codec := range schemas.Codecs {
		enc, err := schemas.NewEncoder(codec)
		if err != nil {
			b.Fatal(err)
		}
		body, err := enc.Encode(nil, recs)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("encode/"+codec, func(b *testing.B) {
			var out []byte
			for b.Loop() {
				out, _ = enc.Encode(out[:0], recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			b.ReportMetric(float64(len(out))/float64(len(recs)), "B/record")
			b.ReportMetric(float64(len(out))/float64(len(plain)), "size_vs_none")
		})
		b.Run("decode/"+codec, func(b *testing.B) {
			dec := schemas.NewDecoder()
			var out []schemas.Flow
			for b.Loop() {
				if out, err = dec.Decode(out[:0], body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
		})
	}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchCPU is the cpu sub-benchmark of BenchmarkWireCodec. Next to the
// codecs it measures lz4-frame, the Arrow stream in one LZ4 frame: a
// candidate that is not offered (see docs/subscribers.md).
func benchCPU(b *testing.B, recs []schemas.Flow) {
	type run struct {
		codec             string
		encode            func(dst []byte) ([]byte, error)
		decode            func(body []byte) error
		body              []byte
		encT, decT, rowsT time.Duration
	}
	dec := schemas.NewDecoder()
	var out []schemas.Flow
	decode := func(body []byte) (err error) { out, err = dec.Decode(out[:0], body); return err }
	// The collector decodes into schemas.Row (columns kept): its CPU per
	// record is the rows figure.
	rdec := schemas.NewDecoderFor(schemas.FlowRows)
	var rows []schemas.Row
	decodeRows := func(body []byte) (err error) { rows, err = rdec.Decode(rows[:0], body); return err }
	var runs []*run
	for _, c := range schemas.Codecs {
		enc, err := schemas.NewEncoder(c)
		if err != nil {
			b.Fatal(err)
		}
		// <codec>-plain: the plain utf8 strings of agents before wire
		// dictionaries, the baseline of the dictionary form.
		penc := enc.PlainStrings()
		runs = append(runs, &run{codec: c, encode: func(dst []byte) ([]byte, error) { return enc.Encode(dst, recs) }, decode: decode},
			&run{codec: c + "-plain", encode: func(dst []byte) ([]byte, error) { return penc.Encode(dst, recs) }, decode: decode})
	}
	plain, _ := schemas.NewEncoder(schemas.CodecNone)
	plain = plain.PlainStrings() // lz4-frame as measured before dictionaries
	var ipcBuf []byte
	var lzOut bytes.Buffer
	lw := lz4.NewWriter(nil)
	lr := lz4.NewReader(nil)
	runs = append(runs, &run{codec: "lz4-frame",
		encode: func(dst []byte) ([]byte, error) {
			var err error
			if ipcBuf, err = plain.Encode(ipcBuf[:0], recs); err != nil {
				return nil, err
			}
			w := bytes.NewBuffer(dst)
			lw.Reset(w)
			if _, err := lw.Write(ipcBuf); err != nil {
				return nil, err
			}
			err = lw.Close() // flushes into w
			return w.Bytes(), err
		},
		decode: func(body []byte) error {
			lzOut.Reset()
			lr.Reset(bytes.NewReader(body))
			if _, err := lzOut.ReadFrom(lr); err != nil {
				return err
			}
			return decode(lzOut.Bytes())
		}})
	for b.Loop() {
		for _, r := range runs {
			t0 := cpuNow()
			var err error
			if r.body, err = r.encode(r.body[:0]); err != nil {
				b.Fatal(err)
			}
			t1 := cpuNow()
			if err := r.decode(r.body); err != nil {
				b.Fatal(err)
			}
			t2 := cpuNow()
			r.encT += t1 - t0
			r.decT += t2 - t1
			if r.codec != "lz4-frame" {
				if err := decodeRows(r.body); err != nil {
					b.Fatal(err)
				}
				r.rowsT += cpuNow() - t2
			}
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*len(recs)) }
	var none *run
	for _, r := range runs {
		if r.codec == schemas.CodecNone {
			none = r
		}
	}
	for _, r := range runs {
		b.ReportMetric(per(r.encT), r.codec+"_enc_cpu_ns/record")
		b.ReportMetric(per(r.decT), r.codec+"_dec_cpu_ns/record")
		if r.codec != "lz4-frame" {
			b.ReportMetric(per(r.rowsT), r.codec+"_dec_rows_cpu_ns/record")
		}
		b.ReportMetric(float64(len(r.body))/float64(len(recs)), r.codec+"_B/record")
		if r != none {
			b.ReportMetric(float64(r.encT)/float64(none.encT), r.codec+"_enc_vs_none")
			b.ReportMetric(float64(r.decT)/float64(none.decT), r.codec+"_dec_vs_none")
		}
	}
	// Dictionary vs plain strings, per codec, same run.
	byCodec := map[string]*run{}
	for _, r := range runs {
		byCodec[r.codec] = r
	}
	for _, c := range schemas.Codecs {
		d, p := byCodec[c], byCodec[c+"-plain"]
		b.ReportMetric(float64(d.encT)/float64(p.encT), c+"_dict_enc_vs_plain")
		b.ReportMetric(float64(d.rowsT)/float64(p.rowsT), c+"_dict_dec_rows_vs_plain")
		b.ReportMetric(float64(len(d.body))/float64(len(p.body)), c+"_dict_B_vs_plain")
	}
}

// BenchmarkFlowEncode: agent-side wire encode (the default codec, lz4, and
// none) of the realistic batch in the binary working form (MACs and IPs
// formatted into the column buffers by the encoder, as the capture's
// records are) against the same batch in text (the former path: text
// made by the decoder, copied by the encoder). Interleaved per iteration
// so both see the same load; CPU ns/record of the process.
func BenchmarkFlowEncode(b *testing.B) {
	src := realistic(b)
	bin := make([]schemas.Flow, len(src))
	text := make([]schemas.Flow, len(src))
	for i := range src {
		bin[i], text[i] = src[i], src[i]
		if !src[i].Bin.Valid {
			b.Fatalf("record %d of the synthetic batch is not binary", i)
		}
		bin[i].VMMAC, bin[i].PeerMAC, bin[i].SrcIP, bin[i].DstIP = "", "", "", ""
		text[i].Bin = schemas.FlowBin{}
	}
	for _, codec := range []string{schemas.CodecLZ4, schemas.CodecNone} {
		b.Run(codec, func(b *testing.B) {
			enc, err := schemas.NewEncoder(codec)
			if err != nil {
				b.Fatal(err)
			}
			var out []byte
			var tBin, tText time.Duration
			b.ReportAllocs()
			for b.Loop() {
				t0 := cpuNow()
				if out, err = enc.Encode(out[:0], bin); err != nil {
					b.Fatal(err)
				}
				t1 := cpuNow()
				if out, err = enc.Encode(out[:0], text); err != nil {
					b.Fatal(err)
				}
				tBin, tText = tBin+t1-t0, tText+cpuNow()-t1
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*len(src)) }
			b.ReportMetric(per(tBin), "binary_cpu_ns/record")
			b.ReportMetric(per(tText), "text_cpu_ns/record")
			b.ReportMetric(0, "ns/op")
		})
	}
}
