package schemas

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas/columns"
)

// MetadataKey is the key of the schema name in Arrow schema metadata and
// Parquet file key-value metadata.
const MetadataKey = "tapflow.schema"

// VersionKey is the key of the schema's major.minor version ("1.1" for
// flow.v1 with the columns of minor 1) in Arrow schema metadata and Parquet
// file key-value metadata. Minor versions only add columns.
const VersionKey = "tapflow.schema_version"

// Table binds a record type to its column table (package columns) and its
// generated column codecs: the Arrow schema, Arrow conversion and the
// Parquet schema of one record type. FlowTable and MeterTable are the
// tables; their methods are safe for concurrent use.
type Table[T any] struct {
	name   string
	minor  int
	cols   []columns.Column
	encode func([]T) []arrow.Array
	decode func([]arrow.Array, []int, []T) error
	// parquet, when set, is the Parquet schema (row tables: T is not the
	// struct the files are laid out by).
	parquet func() *parquet.Schema

	once   sync.Once
	schema *arrow.Schema
}

// FlowTable is flow.v1.
var FlowTable = &Table[Flow]{name: columns.SchemaName, minor: columns.FlowMinor, cols: columns.FlowV1, encode: encodeFlowColumns, decode: decodeFlowColumns}

// MeterTable is meter.v1.
var MeterTable = &Table[Meter]{name: columns.MeterSchemaName, minor: columns.MeterMinor, cols: columns.MeterV1, encode: encodeMeterColumns, decode: decodeMeterColumns}

// Name is the schema name (flow.v1): the value of MetadataKey.
func (t *Table[T]) Name() string { return t.name }

// Version is the schema's "major.minor" (VersionKey): flow.v1 with minor 1
// is "1.1".
func (t *Table[T]) Version() string {
	major := t.name
	if i := strings.LastIndex(major, ".v"); i >= 0 {
		major = major[i+2:]
	}
	return major + "." + strconv.Itoa(t.minor)
}

// ColumnIndex is the position of the named column in the column table,
// -1 when there is none.
func (t *Table[T]) ColumnIndex(name string) int {
	return slices.IndexFunc(t.cols, func(c columns.Column) bool { return c.Name == name })
}

// Columns is the column table.
func (t *Table[T]) Columns() []columns.Column { return t.cols }

// ArrowSchema returns the Arrow schema derived from the column table.
// Strings are plain utf8 (the wire codec compresses repeats; the Parquet
// writer dictionary-encodes), timestamps are µs UTC, counters int64.
func (t *Table[T]) ArrowSchema() *arrow.Schema {
	t.once.Do(func() {
		fields := make([]arrow.Field, len(t.cols))
		for i, c := range t.cols {
			fields[i] = arrow.Field{Name: c.Name, Type: arrowType(c.Kind)}
		}
		md := arrow.NewMetadata([]string{MetadataKey, VersionKey}, []string{t.name, t.Version()})
		t.schema = arrow.NewSchema(fields, &md)
	})
	return t.schema
}

// ParquetSchema returns the Parquet schema, derived from the generated
// struct tags (and so from the column table).
func (t *Table[T]) ParquetSchema() *parquet.Schema {
	if t.parquet != nil {
		return t.parquet()
	}
	var zero T
	return parquet.SchemaOf(zero)
}

// ToArrow converts records to an Arrow record batch. The caller releases it.
func (t *Table[T]) ToArrow(recs []T) arrow.RecordBatch {
	return array.NewRecordBatch(t.ArrowSchema(), t.encode(recs), int64(len(recs)))
}

// FromArrow appends the rows of rec to dst. Columns are matched by name, so
// a batch with extra (newer) columns still decodes, and one from a writer
// of an older minor version lacks only columns added since (Since > 0):
// they read as zero values. Any other missing or mistyped column, or a
// null, is an error. Decoded strings never point into Arrow memory.
func (t *Table[T]) FromArrow(rec arrow.RecordBatch, dst []T) ([]T, error) {
	sc := rec.Schema()
	n := int(rec.NumRows())
	cols := rec.Columns()
	nread := len(cols)
	idx := make([]int, len(t.cols))
	for i, c := range t.cols {
		pos := sc.FieldIndices(c.Name)
		if len(pos) == 0 && c.Since > 0 {
			zero := zeroArray(c.Kind, n)
			defer zero.Release()
			if len(cols) == nread {
				cols = slices.Clone(cols)
			}
			idx[i] = len(cols)
			cols = append(cols, zero)
			continue
		}
		if len(pos) != 1 {
			return dst, fmt.Errorf("column %s: missing from batch (schema has %d fields)", c.Name, sc.NumFields())
		}
		idx[i] = pos[0]
	}
	for _, i := range idx {
		if i < nread && cols[i].NullN() > 0 {
			return dst, fmt.Errorf("column %s: %d nulls; %s has no nullable columns", sc.Field(i).Name, cols[i].NullN(), t.name)
		}
	}
	start := len(dst)
	dst = grow(dst, n)
	if err := t.decode(cols, idx, dst[start:]); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// ArrowSchema returns the Arrow schema of flow.v1 (FlowTable.ArrowSchema).
func ArrowSchema() *arrow.Schema { return FlowTable.ArrowSchema() }

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

// ToArrow converts flow records to an Arrow record batch
// (FlowTable.ToArrow). The caller releases it.
func ToArrow(recs []Flow) arrow.RecordBatch { return FlowTable.ToArrow(recs) }

// FromArrow appends the flow rows of rec to dst (FlowTable.FromArrow).
func FromArrow(rec arrow.RecordBatch, dst []Flow) ([]Flow, error) {
	return FlowTable.FromArrow(rec, dst)
}

func grow[T any](dst []T, n int) []T {
	if cap(dst)-len(dst) < n {
		nd := make([]T, len(dst), len(dst)+n)
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

// zeroArray is n zero values of kind k: a column an older writer did not
// have.
func zeroArray(k columns.Kind, n int) arrow.Array {
	switch k {
	case columns.String:
		var c stringColumn
		c.reset(n, 0)
		for range n {
			c.add("")
		}
		return c.array()
	case columns.Int32:
		return int32Array(make([]int32, n))
	case columns.Timestamp:
		return timestampArray(make([]int64, n))
	}
	return int64Array(make([]int64, n))
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
