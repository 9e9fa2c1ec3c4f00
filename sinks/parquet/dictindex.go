package parquet

import (
	"reflect"
	"unsafe"

	pq "github.com/parquet-go/parquet-go"
)

// Writing the wire's dictionary indices (issue 24): a dictionary-encoded
// wire column's rows are indices into the message's dictionary, and a
// Parquet dictionary column's page buffer holds indices into the row
// group's dictionary. parquet-go only fills that buffer through
// Dictionary.Insert, a map lookup per value (a quarter of the
// collector's CPU); it has no exported way to append indices. So each
// message entry a piece of rows uses is inserted once (Insert of one
// value: the same dictionary, in the same order, as inserting every row),
// and the rows' ids are appended to the buffer's index slice, which this
// file finds by field name in parquet-go's unexported structs. Anything
// that does not match the layout read here (another parquet-go version,
// the plain buffer after the dictionary outgrew DictionaryMaxBytes, an
// optional column) takes the value path; TestDictIndexLayout fails when
// the fast path is lost.
//
// Integer columns skip pq.Value the same way: the page buffer found here
// takes []int64 / []int32 through parquet-go's exported Int64Writer and
// Int32Writer, straight from the Arrow buffer when a piece is a run of
// one message's rows.

const pqPkg = "github.com/parquet-go/parquet-go"

// bufferField is the offset of ColumnWriter.columnBuffer (the current
// page's buffer), ok false when parquet-go has no such field.
func bufferField() (off uintptr, ok bool) {
	f, found := reflect.TypeFor[pq.ColumnWriter]().FieldByName("columnBuffer")
	if !found || f.Type != reflect.TypeFor[pq.ColumnBuffer]() || len(f.Index) != 1 {
		return 0, false
	}
	return f.Offset, true
}

// indexLayout is where a page buffer type keeps its indices.
type indexLayout struct {
	typ reflect.Type // *parquet.indexedColumnBuffer
	off uintptr      // of its values []int32
}

// layoutOf returns the index slice offset for buffer type t (a pointer to
// parquet-go's indexedColumnBuffer), ok false for any other type.
func layoutOf(t reflect.Type) (indexLayout, bool) {
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return indexLayout{}, false
	}
	s := t.Elem()
	if s.Name() != "indexedColumnBuffer" || s.PkgPath() != pqPkg {
		return indexLayout{}, false
	}
	f, ok := s.FieldByName("values")
	if !ok || f.Type != reflect.TypeFor[[]int32]() {
		return indexLayout{}, false
	}
	// Promoted fields report offsets within their own struct: add the
	// embedding's.
	var off uintptr
	cur := s
	for _, i := range f.Index {
		sf := cur.Field(i)
		off += sf.Offset
		cur = sf.Type
	}
	return indexLayout{typ: t, off: off}, true
}

// dictIndexer finds the index slice of a ColumnWriter's current buffer.
type dictIndexer struct {
	bufOff   uintptr
	ok       bool
	layout   indexLayout
	haveType bool
	dict     dictField // dictbounds.go
	haveDict bool
}

func newDictIndexer() dictIndexer {
	off, ok := bufferField()
	return dictIndexer{bufOff: off, ok: ok}
}

// buffer returns cw's current page buffer, creating it as a first write
// would; nil when parquet-go has no such field.
func (x *dictIndexer) buffer(cw *pq.ColumnWriter) pq.ColumnBuffer {
	if !x.ok {
		return nil
	}
	buf := (*pq.ColumnBuffer)(unsafe.Add(unsafe.Pointer(cw), x.bufOff))
	if *buf == nil {
		// WriteRowValues creates the buffer lazily; no values, no rows
		// (an empty slice, not nil: see Write).
		var none [1]pq.Value
		if _, err := cw.WriteRowValues(none[:0]); err != nil {
			return nil
		}
	}
	return *buf
}

// slot returns cw's current page indices and the dictionary they index;
// nil when cw's buffer is not parquet-go's plain dictionary buffer.
func (x *dictIndexer) slot(cw *pq.ColumnWriter) (*[]int32, pq.Dictionary) {
	buf := x.buffer(cw)
	if buf == nil {
		return nil, nil
	}
	t := reflect.TypeOf(buf)
	if !x.haveType || t != x.layout.typ {
		l, ok := layoutOf(t)
		if !ok {
			return nil, nil
		}
		x.layout, x.haveType = l, true
	}
	x.wrapBounds(buf) // else parquet-go's own Bounds: the same bounds, slower
	d := buf.Dictionary()
	if d == nil {
		return nil, nil
	}
	p := reflect.ValueOf(buf).UnsafePointer()
	return (*[]int32)(unsafe.Add(p, x.layout.off)), d
}
