package schemas

import (
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// v10Batch is recs as a writer of flow.v1.0 sends them: without the
// columns of later minor versions (and without skip, when given).
func v10Batch(t *testing.T, recs []Flow, skip string) arrow.RecordBatch {
	t.Helper()
	full := ToArrow(recs)
	defer full.Release()
	var fields []arrow.Field
	var cols []arrow.Array
	for i, c := range FlowTable.Columns() {
		if c.Since > 0 || c.Name == skip {
			continue
		}
		fields = append(fields, full.Schema().Field(i))
		cols = append(cols, full.Column(i))
	}
	md := arrow.NewMetadata([]string{MetadataKey, VersionKey}, []string{SchemaName, "1.0"})
	return array.NewRecordBatch(arrow.NewSchema(fields, &md), cols, full.NumRows())
}

// TestOlderMinorDecodes: a batch from an agent of an older minor version
// (rolling upgrade) decodes, its newer columns zero; a missing column of
// the original version is still an error.
func TestOlderMinorDecodes(t *testing.T) {
	if FlowTable.Version() != "1.1" {
		t.Fatalf("flow version %q, want 1.1", FlowTable.Version())
	}
	recs := []Flow{
		{Direction: "tx", TenantID: "t1", Bytes: 10, LBID: "lb1", LBSegment: 2, PoolID: "pool1", MemberID: "m1"},
		{Direction: "rx", TenantID: "t2", Bytes: 20},
	}
	rec := v10Batch(t, recs, "")
	defer rec.Release()
	got, err := FromArrow(rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].PoolID != "" || got[0].MemberID != "" || got[0].LBID != "lb1" || got[1].Bytes != 20 {
		t.Fatalf("decoded %+v", got)
	}
	bad := v10Batch(t, recs, "tenant_id")
	defer bad.Release()
	if _, err := FromArrow(bad, nil); err == nil || !strings.Contains(err.Error(), "column tenant_id: missing") {
		t.Fatalf("missing v1.0 column: %v", err)
	}
	if v, _ := FlowTable.ArrowSchema().Metadata().GetValue(VersionKey); v != "1.1" {
		t.Errorf("arrow schema %s = %q", VersionKey, v)
	}
}
