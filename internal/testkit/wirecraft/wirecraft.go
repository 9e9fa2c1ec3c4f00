// Package wirecraft builds flow.v1 wire bodies with one column replaced
// by a hand-made Arrow array: hostile dictionaries (an index out of
// range, a dictionary of the wrong value type, a huge dictionary) that
// tapflow's encoder never produces, for the decoders' and the
// collector's dead-letter tests. Test-only.
package wirecraft

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/tapflow/tapflow/schemas"
)

// Body encodes recs as a flow.v1 Arrow IPC stream (codec none, or opts:
// ipc.WithLZ4() for a compressed dictionary bomb) with column name
// replaced by col (released by Body).
func Body(recs []schemas.Flow, name string, col arrow.Array, opts ...ipc.Option) ([]byte, error) {
	defer col.Release()
	rec := schemas.ToArrow(recs)
	defer rec.Release()
	sc := rec.Schema()
	pos := sc.FieldIndices(name)
	if len(pos) != 1 {
		return nil, fmt.Errorf("wirecraft: no column %s", name)
	}
	fields := sc.Fields()
	fields[pos[0]].Type = col.DataType()
	md := sc.Metadata()
	cols := rec.Columns()
	cols = append([]arrow.Array(nil), cols...)
	cols[pos[0]] = col
	out := array.NewRecordBatch(arrow.NewSchema(fields, &md), cols, rec.NumRows())
	defer out.Release()
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, append([]ipc.Option{ipc.WithSchema(out.Schema())}, opts...)...)
	if err := w.Write(out); err != nil {
		return nil, fmt.Errorf("wirecraft: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("wirecraft: %w", err)
	}
	return buf.Bytes(), nil
}

// Dict is a dictionary<index, dict.DataType()> array of the given keys.
func Dict(index arrow.DataType, keys []int64, dict arrow.Array) arrow.Array {
	defer dict.Release()
	b := array.NewBuilder(memory.DefaultAllocator, index)
	defer b.Release()
	for _, k := range keys {
		switch ib := b.(type) {
		case *array.Int8Builder:
			ib.Append(int8(k))
		case *array.Int16Builder:
			ib.Append(int16(k))
		case *array.Int32Builder:
			ib.Append(int32(k))
		case *array.Int64Builder:
			ib.Append(k)
		case *array.Uint32Builder:
			ib.Append(uint32(k))
		}
	}
	idx := b.NewArray()
	defer idx.Release()
	return array.NewDictionaryArray(&arrow.DictionaryType{IndexType: index, ValueType: dict.DataType()}, idx, dict)
}

// Strings is a utf8 array of vals.
func Strings(vals ...string) arrow.Array {
	b := array.NewStringBuilder(memory.DefaultAllocator)
	defer b.Release()
	b.AppendValues(vals, nil)
	return b.NewArray()
}

// NStrings is a utf8 array of n distinct values.
func NStrings(n int) arrow.Array {
	b := array.NewStringBuilder(memory.DefaultAllocator)
	defer b.Release()
	for i := range n {
		b.Append("v" + strconv.Itoa(i))
	}
	return b.NewArray()
}

// Int64s is an int64 array of vals.
func Int64s(vals ...int64) arrow.Array {
	b := array.NewInt64Builder(memory.DefaultAllocator)
	defer b.Release()
	b.AppendValues(vals, nil)
	return b.NewArray()
}

// Keys is n indices cycling through 0..m-1, with keys[at] = bad when
// at >= 0.
func Keys(n, m int, at int, bad int64) []int64 {
	k := make([]int64, n)
	for i := range k {
		k[i] = int64(i % m)
	}
	if at >= 0 {
		k[at] = bad
	}
	return k
}
