package schemas

import (
	"fmt"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/tapflow/tapflow/schemas/columns"
)

// MetadataKey is the key of the schema name in Arrow schema metadata and
// Parquet file key-value metadata.
const MetadataKey = "tapflow.schema"

var (
	arrowOnce   sync.Once
	arrowSchema *arrow.Schema
)

// ArrowSchema returns the Arrow schema of flow.v1, derived from the column
// table. Strings are plain utf8 (the wire codec compresses repeats; the
// Parquet writer dictionary-encodes), timestamps are µs UTC, counters int64.
func ArrowSchema() *arrow.Schema {
	arrowOnce.Do(func() {
		fields := make([]arrow.Field, len(columns.FlowV1))
		for i, c := range columns.FlowV1 {
			fields[i] = arrow.Field{Name: c.Name, Type: arrowType(c.Kind)}
		}
		md := arrow.NewMetadata([]string{MetadataKey}, []string{columns.SchemaName})
		arrowSchema = arrow.NewSchema(fields, &md)
	})
	return arrowSchema
}

var timestampUTC = &arrow.TimestampType{Unit: arrow.Microsecond, TimeZone: "UTC"}

func arrowType(k columns.Kind) arrow.DataType {
	switch k {
	case columns.Timestamp:
		return timestampUTC
	case columns.String:
		return arrow.BinaryTypes.String
	case columns.Int32:
		return arrow.PrimitiveTypes.Int32
	default:
		return arrow.PrimitiveTypes.Int64
	}
}

// ToArrow converts records to an Arrow record batch. The caller releases it.
func ToArrow(recs []Flow) arrow.RecordBatch {
	return array.NewRecordBatch(ArrowSchema(), encodeFlowColumns(recs), int64(len(recs)))
}

// FromArrow appends the rows of rec to dst. Columns are matched by name, so
// a batch with extra (newer) columns still decodes; a missing or mistyped
// flow.v1 column, or a null, is an error. Decoded strings never point into
// Arrow memory.
func FromArrow(rec arrow.RecordBatch, dst []Flow) ([]Flow, error) {
	sc := rec.Schema()
	idx := make([]int, len(columns.FlowV1))
	for i, c := range columns.FlowV1 {
		pos := sc.FieldIndices(c.Name)
		if len(pos) != 1 {
			return dst, fmt.Errorf("column %s: missing from batch (schema has %d fields)", c.Name, sc.NumFields())
		}
		idx[i] = pos[0]
	}
	cols := rec.Columns()
	for _, i := range idx {
		if cols[i].NullN() > 0 {
			return dst, fmt.Errorf("column %s: %d nulls; flow.v1 has no nullable columns", sc.Field(i).Name, cols[i].NullN())
		}
	}
	n := int(rec.NumRows())
	start := len(dst)
	dst = growFlows(dst, n)
	if err := decodeFlowColumns(cols, idx, dst[start:]); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

func growFlows(dst []Flow, n int) []Flow {
	if cap(dst)-len(dst) < n {
		nd := make([]Flow, len(dst), len(dst)+n)
		copy(nd, dst)
		dst = nd
	}
	return dst[:len(dst)+n]
}

// stringColumn builds a utf8 array from one offsets and one data buffer.
type stringColumn struct {
	offsets []int32
	data    []byte
}

func (s *stringColumn) reset(n, avg int) {
	s.offsets = make([]int32, 1, n+1)
	s.data = make([]byte, 0, n*avg)
}

func (s *stringColumn) add(v string) {
	s.data = append(s.data, v...)
	s.offsets = append(s.offsets, int32(len(s.data)))
}

func (s *stringColumn) array() arrow.Array {
	n := len(s.offsets) - 1
	d := array.NewData(arrow.BinaryTypes.String, n, []*memory.Buffer{
		nil,
		memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(s.offsets)),
		memory.NewBufferBytes(s.data),
	}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

func int32Array(v []int32) arrow.Array {
	d := array.NewData(arrow.PrimitiveTypes.Int32, len(v), []*memory.Buffer{nil, memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(v))}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

func int64Array(v []int64) arrow.Array {
	d := array.NewData(arrow.PrimitiveTypes.Int64, len(v), []*memory.Buffer{nil, memory.NewBufferBytes(arrow.Int64Traits.CastToBytes(v))}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

func timestampArray(v []int64) arrow.Array {
	d := array.NewData(timestampUTC, len(v), []*memory.Buffer{nil, memory.NewBufferBytes(arrow.Int64Traits.CastToBytes(v))}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

// columnString copies the character data of a utf8 array into one Go
// string (one allocation per column per batch) and returns it with the
// value offsets; value i is data[offs[i]-offs[0] : offs[i+1]-offs[0]].
func columnString(c *array.String) (string, []int32) {
	offs := c.ValueOffsets()
	if len(offs) == 0 {
		return "", []int32{0}
	}
	return string(c.ValueBytes()), offs
}
