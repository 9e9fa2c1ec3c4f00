package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func flows(n int) []schemas.Flow {
	v := make([]schemas.Flow, n)
	for i := range v {
		v[i] = schemas.Flow{TimeEnd: int64(i) * 1e6, Direction: "tx", TenantID: "t", Zone: "external", Packets: int64(i), Bytes: int64(i) * 100, RecordIndex: int32(i)}
	}
	return v
}

func TestSink(t *testing.T) {
	for _, tc := range []struct {
		name      string
		path      func(dir string) string
		cancel    bool
		wantOK    bool
		wantErr   bool // Run returns an error
		wantLines int
	}{
		{name: "writes every record", path: func(d string) string { return filepath.Join(d, "f.jsonl") }, wantOK: true, wantLines: 250},
		{name: "unwritable path", path: func(d string) string { return filepath.Join(d, "missing", "f.jsonl") }, wantErr: true},
		{name: "hard stop", path: func(d string) string { return filepath.Join(d, "f.jsonl") }, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path(t.TempDir())
			s, err := New(p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			recs := flows(250)
			var ok, failed int
			in := make(chan *pipeline.Batch)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx, in) }()
			for i := 0; i < len(recs); i += 100 {
				in <- pipeline.NewBatch(recs[i:min(i+100, len(recs))], func(err error) {
					if err != nil {
						failed++
					} else {
						ok++
					}
				})
			}
			if tc.cancel {
				cancel()
			}
			close(in)
			err = <-done
			if (err != nil) != tc.wantErr {
				t.Fatalf("Run = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantOK && (ok != 3 || failed != 0) || !tc.wantOK && (ok != 0 || failed != 3) {
				t.Fatalf("acks %d ok %d failed; want ok=%v for all 3", ok, failed, tc.wantOK)
			}
			if tc.wantLines == 0 {
				return
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var got []schemas.Flow
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var r schemas.Flow
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatalf("line %d: %v", len(got)+1, err)
				}
				got = append(got, r)
			}
			if !reflect.DeepEqual(got, recs) {
				t.Fatalf("read %d records back, differing from the %d written", len(got), len(recs))
			}
		})
	}
}
