package schemas

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// olderBatch is recs as a writer of flow.v1.<minor> sends them: without
// the columns of later minor versions (and without skip, when given).
func olderBatch(t *testing.T, recs []Flow, minor int, skip string) arrow.RecordBatch {
	t.Helper()
	full := ToArrow(recs)
	defer full.Release()
	var fields []arrow.Field
	var cols []arrow.Array
	for i, c := range FlowTable.Columns() {
		if c.Since > minor || c.Name == skip {
			continue
		}
		fields = append(fields, full.Schema().Field(i))
		cols = append(cols, full.Column(i))
	}
	md := arrow.NewMetadata([]string{MetadataKey, VersionKey}, []string{SchemaName, fmt.Sprintf("1.%d", minor)})
	return array.NewRecordBatch(arrow.NewSchema(fields, &md), cols, full.NumRows())
}

// TestOlderMinorDecodes: a batch from an agent of an older minor version
// (rolling upgrade: collectors first) decodes, its newer columns zero; a
// missing column of the original version is still an error.
func TestOlderMinorDecodes(t *testing.T) {
	if FlowTable.Version() != "1.2" {
		t.Fatalf("flow version %q, want 1.2", FlowTable.Version())
	}
	recs := []Flow{
		{Direction: "tx", TenantID: "t1", Bytes: 10, LBID: "lb1", LBSegment: 2, PoolID: "pool1", MemberID: "m1", LBTap: "member"},
		{Direction: "rx", TenantID: "t2", Bytes: 20},
	}
	tests := []struct {
		minor             int
		pool, member, tap string // of recs[0] decoded
	}{
		{0, "", "", ""},
		{1, "pool1", "m1", ""},
		{2, "pool1", "m1", "member"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("flow.v1.%d", tc.minor), func(t *testing.T) {
			rec := olderBatch(t, recs, tc.minor, "")
			defer rec.Release()
			got, err := FromArrow(rec, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[0].PoolID != tc.pool || got[0].MemberID != tc.member || got[0].LBTap != tc.tap || got[0].LBID != "lb1" || got[1].Bytes != 20 {
				t.Fatalf("decoded %+v", got)
			}
			// The collector's row form too.
			rows, err := FlowRows.FromArrow(rec, nil)
			if err != nil || len(rows) != 2 {
				t.Fatalf("rows: %d, %v", len(rows), err)
			}
		})
	}
	bad := olderBatch(t, recs, 0, "tenant_id")
	defer bad.Release()
	if _, err := FromArrow(bad, nil); err == nil || !strings.Contains(err.Error(), "column tenant_id: missing") {
		t.Fatalf("missing v1.0 column: %v", err)
	}
	if v, _ := FlowTable.ArrowSchema().Metadata().GetValue(VersionKey); v != "1.2" {
		t.Errorf("arrow schema %s = %q", VersionKey, v)
	}
}

// TestNewerMinorDecodes: a batch from an agent of a newer minor version
// (a column this reader does not know; e.g. lb_tap at a flow.v1.1
// collector, or after a rollback) decodes by name, the unknown column
// ignored, into records and into the collector's rows.
func TestNewerMinorDecodes(t *testing.T) {
	recs := []Flow{{Direction: "tx", TenantID: "t1", Bytes: 10, LBID: "lb1", LBSegment: 2, LBTap: "amphora"}}
	full := ToArrow(recs)
	defer full.Release()
	b := array.NewStringBuilder(memory.DefaultAllocator)
	b.Append("from the future")
	extra := b.NewArray()
	defer extra.Release()
	fields := append(slices.Clone(full.Schema().Fields()), arrow.Field{Name: "future_column", Type: arrow.BinaryTypes.String})
	md := full.Schema().Metadata()
	rec := array.NewRecordBatch(arrow.NewSchema(fields, &md), append(slices.Clone(full.Columns()), extra), 1)
	defer rec.Release()
	got, err := FromArrow(rec, nil)
	if err != nil || len(got) != 1 || got[0].LBTap != "amphora" || got[0].Bytes != 10 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if rows, err := FlowRows.FromArrow(rec, nil); err != nil || len(rows) != 1 {
		t.Fatalf("rows: %d, %v", len(rows), err)
	}
}
