package dlq

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// FuzzLetter: a dead letter as `tapflow dlq inspect` and `replay` read
// it, headers and body from the DLQ stream (whatever a collector moved
// there, so whatever an agent published). No panic, even for a body whose
// decode panics; a letter that does not decode says why.
func FuzzLetter(f *testing.F) {
	flows, err := schemas.NewEncoder(schemas.CodecZstd)
	if err != nil {
		f.Fatal(err)
	}
	flowBody, err := flows.Encode(nil, []schemas.Flow{{TimeStart: 1, TimeEnd: 2, Node: "cmp7", Ifname: "tap1", Direction: "tx"}})
	if err != nil {
		f.Fatal(err)
	}
	meters, err := schemas.NewEncoderFor(schemas.MeterTable, schemas.CodecNone)
	if err != nil {
		f.Fatal(err)
	}
	meterBody, err := meters.Encode(nil, []schemas.Meter{{TimeStart: 1, TimeEnd: 2, Node: "cmp7"}})
	if err != nil {
		f.Fatal(err)
	}
	hdr := func(kv ...string) string {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		var b bytes.Buffer
		_ = h.Write(&b)
		return b.String()
	}
	full := hdr(transport.HeaderOrigSubject, "tapflow.flows.v1.cmp7", transport.HeaderOrigSeq, "42", transport.HeaderOrigStream, transport.FlowsStream,
		transport.HeaderOrigMsgID, "cmp7-flows-9", transport.HeaderReason, "time", transport.HeaderError, "time_end 3h ahead")
	f.Add(transport.DLQFlowsSubject, full, flowBody, "tapflow.flows.v1.*")
	f.Add(transport.DLQMetersSubject, hdr(transport.HeaderOrigSubject, "tapflow.meters.v1.cmp7", transport.HeaderOrigSeq, "x"), meterBody, ">")
	f.Add(transport.DLQFlowsSubject, "", []byte{}, "")
	f.Add(transport.DLQFlowsSubject, full, flowBody[:len(flowBody)/2], "tapflow.>")
	f.Add(transport.DLQMetersSubject, full, flowBody, "*.*.*.*") // a flow body on the meters subject
	f.Add("tapflow.dlq.flows", hdr(transport.HeaderOrigSubject, "\x1b[2Jtapflow.flows.v1.cmp7", transport.HeaderOrigMsgID, "\x1b]0;owned\x07"), []byte("ARROW1"), "..")
	f.Fuzz(func(t *testing.T, subject, header string, data []byte, pattern string) {
		h := nats.Header{}
		for _, line := range bytes.Split([]byte(header), []byte("\r\n")) {
			if k, v, ok := bytes.Cut(line, []byte(": ")); ok {
				h.Add(string(k), string(v))
			}
		}
		m := &jetstream.RawStreamMsg{Subject: subject, Sequence: 7, Header: h, Data: data, Time: time.Unix(1700000000, 0)}
		l := letterOf(m)
		if l.Records < 0 && l.DecodeError == "" {
			t.Fatal("a letter that does not decode without a decode error")
		}
		if l.Records >= 0 && l.DecodeError != "" {
			t.Fatal("records counted and a decode error")
		}
		_ = SubjectMatch(pattern, l.OrigSubject)
		_ = Filter{Reason: l.Reason, Subject: pattern}.match(&l)
		// dry run: decides without NATS
		r := replayOne(context.Background(), nil, nil, l, true, time.Second)
		if r.Outcome != WouldReplay && r.Outcome != Skipped {
			t.Fatalf("dry run gave %s", r.Outcome)
		}
	})
}
