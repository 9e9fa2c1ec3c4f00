package schemas

import (
	"bytes"
	"fmt"
	"testing"
)

// TestEncodeBatchIdentity: EncodeBatch writes the batch's identity
// (agent_id, batch_seq, and each record's position as record_index)
// whatever the records' own fields hold, and the message is byte for
// byte the one Encode makes of the same records stamped with that
// identity, in every wire form and codec, for flows, meters and the
// collector's rows: the wire did not change, only who fills the columns.
// Encode still sends the records' own identity.
func TestEncodeBatchIdentity(t *testing.T) {
	id := Identity{AgentID: "agent-cmp-17", BatchSeq: 4_000_000_123}
	forms := []struct {
		name string
		form func(*EncoderOf[Flow]) *EncoderOf[Flow]
	}{
		{"narrow", func(e *EncoderOf[Flow]) *EncoderOf[Flow] { return e }},
		{"wide", (*EncoderOf[Flow]).WideIndices},
		{"plain", (*EncoderOf[Flow]).PlainStrings},
	}
	for _, codec := range Codecs {
		for _, f := range forms {
			for _, n := range []int{0, 1, 1000} {
				t.Run(fmt.Sprintf("flow/%s/%s/%d", codec, f.name, n), func(t *testing.T) {
					enc, err := NewEncoder(codec)
					if err != nil {
						t.Fatal(err)
					}
					enc = f.form(enc)
					stamped, unstamped := sample(n), sample(n)
					for i := range stamped {
						stamped[i].AgentID, stamped[i].BatchSeq, stamped[i].RecordIndex = id.AgentID, id.BatchSeq, int32(i)
						// Other identities, left in the rows on purpose.
						unstamped[i].AgentID, unstamped[i].BatchSeq, unstamped[i].RecordIndex = fmt.Sprint("stale-", i%3), int64(i), int32(-i)
					}
					want, err := enc.Encode(nil, stamped)
					if err != nil {
						t.Fatal(err)
					}
					got, err := enc.EncodeBatch(nil, unstamped, id)
					if err != nil {
						t.Fatal(err)
					}
					checkIdentity(t, NewDecoderFor(FlowTable), got, id, n, func(r Flow) (string, int64, int32) { return r.AgentID, r.BatchSeq, r.RecordIndex })
					if codec != CodecZstd && !bytes.Equal(got, want) {
						// zstd frames are not compared: the identity is checked above.
						t.Errorf("EncodeBatch: %d bytes differ from Encode of stamped records (%d bytes)", len(got), len(want))
					}
					own, err := enc.Encode(nil, unstamped)
					if err != nil {
						t.Fatal(err)
					}
					recs, err := NewDecoderFor(FlowTable).Decode(nil, own)
					if err != nil {
						t.Fatal(err)
					}
					for i, r := range recs {
						if r.AgentID != unstamped[i].AgentID || r.BatchSeq != int64(i) || r.RecordIndex != int32(-i) {
							t.Fatalf("Encode record %d: identity %s/%d/%d, want the record's own", i, r.AgentID, r.BatchSeq, r.RecordIndex)
						}
					}
				})
			}
		}
	}
	for _, n := range []int{0, 1, 300} {
		t.Run(fmt.Sprintf("meter/%d", n), func(t *testing.T) {
			enc, err := NewEncoderFor(MeterTable, CodecLZ4)
			if err != nil {
				t.Fatal(err)
			}
			recs := sampleMeters(n)
			for i := range recs {
				recs[i].AgentID, recs[i].BatchSeq, recs[i].RecordIndex = "", 0, 0
			}
			body, err := enc.EncodeBatch(nil, recs, id)
			if err != nil {
				t.Fatal(err)
			}
			checkIdentity(t, NewDecoderFor(MeterTable), body, id, n, func(r Meter) (string, int64, int32) { return r.AgentID, r.BatchSeq, r.RecordIndex })
			rows, err := NewDecoderFor(MeterRows).Decode(nil, body)
			if err != nil {
				t.Fatal(err)
			}
			rowEnc, err := NewEncoderFor(MeterRows, CodecLZ4)
			if err != nil {
				t.Fatal(err)
			}
			other := Identity{AgentID: "agent-b", BatchSeq: 12}
			again, err := rowEnc.EncodeBatch(nil, rows, other)
			if err != nil {
				t.Fatal(err)
			}
			checkIdentity(t, NewDecoderFor(MeterTable), again, other, n, func(r Meter) (string, int64, int32) { return r.AgentID, r.BatchSeq, r.RecordIndex })
		})
	}
}

func checkIdentity[T any](t *testing.T, dec *DecoderOf[T], body []byte, id Identity, n int, of func(T) (string, int64, int32)) {
	t.Helper()
	recs, err := dec.Decode(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("decoded %d records, want %d", len(recs), n)
	}
	for i, r := range recs {
		if a, s, k := of(r); a != id.AgentID || s != id.BatchSeq || k != int32(i) {
			t.Fatalf("record %d: identity %s/%d/%d, want %s/%d/%d", i, a, s, k, id.AgentID, id.BatchSeq, i)
		}
	}
}
