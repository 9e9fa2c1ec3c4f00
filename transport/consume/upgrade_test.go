package consume_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// TestOldFormatMessagesDecodeAfterUpgrade: during an upgrade the stream
// still holds batches of agents before the subscriber contract — the
// Arrow stream in a zstd frame, no Tapflow-* headers. The collector reads
// them next to new batches (headers, every codec) and loses nothing.
func TestOldFormatMessagesDecodeAfterUpgrade(t *testing.T) {
	s := transporttest.Run(t, "")
	zenc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := schemas.NewEncoder(schemas.CodecNone)
	want, wantBytes := 0, int64(0)
	for i := range 3 {
		seq := int64(1000 + i)
		recs := make([]schemas.Flow, 500)
		for j := range recs {
			recs[j] = schemas.Flow{Node: "cmp0", AgentID: "cmp0", BatchSeq: seq, RecordIndex: int32(j), TenantID: "t1",
				Direction: "tx", Bytes: int64(j + 1), Packets: 1, TimeEnd: time.Now().UnixMicro()}
			wantBytes += int64(j + 1)
		}
		ipc, err := plain.Encode(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: transport.FlowsSubject("cmp0"), Data: zenc.EncodeAll(ipc, nil), Header: nats.Header{}}
		if _, err := s.JS.PublishMsg(context.Background(), msg, js.WithMsgID("cmp0-"+strconv.FormatInt(seq, 10))); err != nil {
			t.Fatal(err)
		}
		want += len(recs)
	}
	// New agents: publishBatches uses the default codec; the other codecs
	// are covered by the publish header test and TestWireRoundTrip.
	publishBatches(t, s, []int{700, 300})
	for i, n := range []int{700, 300} {
		want += n
		for j := range n {
			wantBytes += int64(100*i + j)
		}
	}
	got := collect(t, s, want, nil)
	var bytes int64
	old := 0
	for _, r := range got {
		bytes += r.Bytes
		if r.AgentID == "cmp0" {
			old++
		}
	}
	if len(got) != want || bytes != wantBytes || old != 1500 {
		t.Fatalf("got %d records (%d old) / %d bytes, want %d (1500 old) / %d", len(got), old, bytes, want, wantBytes)
	}
	if info, err := s.JS.Stream(context.Background(), transport.DLQStream); err == nil {
		if n := info.CachedInfo().State.Msgs; n != 0 {
			t.Fatalf("%d messages dead-lettered, want 0", n)
		}
	}
}
