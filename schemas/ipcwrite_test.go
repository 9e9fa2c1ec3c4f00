package schemas

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestIPCWriterSameBytes: the encoders' own IPC writer (ipcwrite.go)
// writes byte for byte the stream arrow-go's ipc.Writer writes for the
// same batch, in every codec and wire form, for flows, meters and the
// collector's rows, with and without a batch identity: dictionaries of
// every index width, buffers over one LZ4 block and blocks that do not
// compress (stored), empty batches and empty strings. One encoder
// writes every batch of a case in turn, so its kept builder, scratch
// and schema messages carry from one message to the next.
func TestIPCWriterSameBytes(t *testing.T) {
	id := &Identity{AgentID: "agent-ipc", BatchSeq: 99}
	batches := []struct {
		name string
		recs []Flow
	}{
		{"empty", sample(0)},
		{"one", sample(1)},
		{"sample", sample(1000)},
		{"mid", noisy(3000)}, // int16 indices, incompressible blocks
		{"sample-again", sample(1000)},
	}
	// int32 indices in the narrow form need over 32,768 values: one
	// batch, in that form only (it is most of the test's time).
	large := noisy(40000)
	forms := []wireForm{formDict, formWide, formPlain}
	for _, codec := range Codecs {
		for _, form := range forms {
			t.Run(fmt.Sprintf("flow/%s/%d", codec, form), func(t *testing.T) {
				enc, err := NewEncoder(codec)
				if err != nil {
					t.Fatal(err)
				}
				enc = enc.withForm(form)
				for _, b := range batches {
					for _, id := range []*Identity{nil, id} {
						sameBytes(t, b.name, enc, b.recs, id)
					}
				}
				if form == formDict && codec != CodecArrowZstd {
					sameBytes(t, "large", enc, large, id)
				}
			})
		}
	}
	for _, codec := range Codecs {
		t.Run("meter/"+codec, func(t *testing.T) {
			enc, err := NewEncoderFor(MeterTable, codec)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{0, 1, 300, 20000} {
				sameBytes(t, fmt.Sprint(n), enc, sampleMeters(n), id)
			}
		})
		t.Run("rows/"+codec, func(t *testing.T) {
			flowEnc, err := NewEncoder(CodecNone)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := NewEncoderFor(FlowRows, codec)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range batches {
				body, err := flowEnc.Encode(nil, b.recs)
				if err != nil {
					t.Fatal(err)
				}
				rows, err := NewDecoderFor(FlowRows).Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				sameBytes(t, b.name, enc, rows, nil)
				sameBytes(t, b.name, enc, rows, id)
			}
		})
	}
}

func sameBytes[T any](t *testing.T, name string, enc *EncoderOf[T], recs []T, id *Identity) {
	t.Helper()
	want, err := enc.encodeArrowGo(recs, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := enc.encode([]byte("prefix"), recs, id)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !bytes.HasPrefix(got, []byte("prefix")) {
		t.Fatalf("%s: dst's bytes were not kept", name)
	}
	got = got[len("prefix"):]
	if !bytes.Equal(got, want) {
		at := 0
		for at < min(len(got), len(want)) && got[at] == want[at] {
			at++
		}
		t.Fatalf("%s (identity %v): %d bytes, arrow-go's writer %d; first difference at byte %d", name, id != nil, len(got), len(want), at)
	}
}

// noisy is n records whose counters are random and whose addresses and
// interface names are mostly distinct: buffers lz4 cannot shrink and
// dictionaries too large for int8 (or int16) indices.
func noisy(n int) []Flow {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	recs := sample(n)
	for i := range recs {
		f := &recs[i]
		f.Packets, f.Bytes, f.TimeStart = r.Int64(), r.Int64(), r.Int64()
		f.SrcIP = fmt.Sprintf("%x:%x::%x", r.Uint32(), r.Uint32(), r.Uint64())
		f.Ifname = fmt.Sprintf("tap%08x", r.Uint32())
		f.TenantID = fmt.Sprint("t-", i%200)
		if i%17 == 0 {
			f.DstIP, f.PortID = "", "" // empty strings among the rest
		}
	}
	return recs
}
