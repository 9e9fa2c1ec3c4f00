package schemas

import (
	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// wireColumn is one column of a message as an encoder built it: the
// buffers the IPC writer sends as they are (ipcwrite.go). ToArrow wraps
// the same buffers as an Arrow array (array); the wire path makes no
// Arrow objects.
type wireColumn struct {
	typ arrow.DataType // int32, int64, timestamp[us, UTC], utf8 or a dictionary of utf8
	n   int            // rows
	// vals are fixed-width values, or a dictionary's indices.
	vals []byte
	// offs and data are a utf8 column's offsets (n+1) and bytes, or a
	// dictionary's values' (dictLen+1).
	offs, data []byte
	dictLen    int
}

func int32Column(v []int32) wireColumn {
	return wireColumn{typ: arrow.PrimitiveTypes.Int32, n: len(v), vals: arrow.Int32Traits.CastToBytes(v)}
}

func int64Column(v []int64) wireColumn {
	return wireColumn{typ: arrow.PrimitiveTypes.Int64, n: len(v), vals: arrow.Int64Traits.CastToBytes(v)}
}

func timestampColumn(v []int64) wireColumn {
	return wireColumn{typ: timestampUTC, n: len(v), vals: arrow.Int64Traits.CastToBytes(v)}
}

// utf8Column is the strings between offsets (len(offsets)-1 of them) in
// data.
func utf8Column(offsets []int32, data []byte) wireColumn {
	return wireColumn{typ: arrow.BinaryTypes.String, n: len(offsets) - 1, offs: arrow.Int32Traits.CastToBytes(offsets), data: data}
}

// array is c as an Arrow array over c's buffers; the caller releases it.
func (c wireColumn) array() arrow.Array {
	switch t := c.typ.(type) {
	case *arrow.DictionaryType:
		dict := stringArray(c.dictLen, c.offs, c.data)
		defer dict.Release()
		keys := fixedArray(t.IndexType, c.n, c.vals)
		defer keys.Release()
		return array.NewDictionaryArray(t, keys, dict)
	case *arrow.StringType:
		return stringArray(c.n, c.offs, c.data)
	}
	return fixedArray(c.typ, c.n, c.vals)
}

func stringArray(n int, offs, data []byte) arrow.Array {
	d := array.NewData(arrow.BinaryTypes.String, n, []*memory.Buffer{nil, memory.NewBufferBytes(offs), memory.NewBufferBytes(data)}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

func fixedArray(t arrow.DataType, n int, vals []byte) arrow.Array {
	d := array.NewData(t, n, []*memory.Buffer{nil, memory.NewBufferBytes(vals)}, nil, 0, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

// arrays wraps cols as Arrow arrays.
func arrays(cols []wireColumn) []arrow.Array {
	out := make([]arrow.Array, len(cols))
	for i, c := range cols {
		out[i] = c.array()
	}
	return out
}
