package cloudkitty_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/klauspost/compress/snappy"
	"google.golang.org/protobuf/encoding/protowire"
)

// sample is one remote-write sample of one series.
type sample struct {
	labels map[string]string // __name__ included
	value  float64
	ts     time.Time
}

// pushRemoteWrite sends samples to Prometheus' remote-write receiver
// (protocol 1: a snappy-compressed prometheus.WriteRequest). This is the
// test's stand-in for billing/usage's publisher until that branch is
// merged; the series and timestamps follow the billing contract.
func pushRemoteWrite(ctx context.Context, promURL string, samples []sample) error {
	var req []byte
	for _, s := range samples {
		var ts []byte
		names := make([]string, 0, len(s.labels))
		for k := range s.labels {
			names = append(names, k)
		}
		sort.Strings(names) // remote write wants labels sorted by name
		for _, k := range names {
			var l []byte
			l = protowire.AppendTag(l, 1, protowire.BytesType)
			l = protowire.AppendString(l, k)
			l = protowire.AppendTag(l, 2, protowire.BytesType)
			l = protowire.AppendString(l, s.labels[k])
			ts = protowire.AppendTag(ts, 1, protowire.BytesType)
			ts = protowire.AppendBytes(ts, l)
		}
		var sm []byte
		sm = protowire.AppendTag(sm, 1, protowire.Fixed64Type)
		sm = protowire.AppendFixed64(sm, math.Float64bits(s.value))
		sm = protowire.AppendTag(sm, 2, protowire.VarintType)
		sm = protowire.AppendVarint(sm, uint64(s.ts.UnixMilli()))
		ts = protowire.AppendTag(ts, 2, protowire.BytesType)
		ts = protowire.AppendBytes(ts, sm)
		req = protowire.AppendTag(req, 1, protowire.BytesType)
		req = protowire.AppendBytes(req, ts)
	}
	hr, err := http.NewRequestWithContext(ctx, "POST", promURL+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, req)))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Encoding", "snappy")
	hr.Header.Set("Content-Type", "application/x-protobuf")
	hr.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("remote write: HTTP %d: %s", resp.StatusCode, b)
	}
	return nil
}
