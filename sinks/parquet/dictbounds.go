package parquet

import (
	"reflect"
	"unsafe"

	pq "github.com/parquet-go/parquet-go"
)

// Page bounds of dictionary pages once per distinct id (issue 24). For
// a dictionary column parquet-go computes each page's min/max by looking
// up and comparing every row's string (Dictionary.Bounds over the page's
// indices). The page uses far fewer distinct ids than it has rows, and a
// minimum or maximum does not depend on how often a value repeats, so
// boundsDict compares each id's string once per page: the same min and
// max, the same Values (the dictionary's Index of the winning ids, what
// parquet-go's own Bounds returns), the same files (TestDictIndicesSameFile
// writes them on the value path, which keeps parquet-go's Bounds).
//
// The page buffer reads its dictionary from its indexedType, an
// unexported struct found here by field name as dictindex.go finds the
// indices; with another layout the column keeps parquet-go's Bounds.

// boundsDict is a byte-array dictionary whose Bounds visits each distinct
// id once. Every other method is the dictionary's own.
type boundsDict struct {
	pq.Dictionary
	stamp []uint32 // per id: the epoch of the page that saw it last
	epoch uint32
}

func (d *boundsDict) Bounds(indexes []int32) (min, max pq.Value) {
	n := d.Len()
	if len(indexes) == 0 || n == 0 {
		return d.Dictionary.Bounds(indexes)
	}
	if len(d.stamp) < n {
		d.stamp = append(d.stamp, make([]uint32, n-len(d.stamp))...)
	}
	if d.epoch++; d.epoch == 0 {
		clear(d.stamp)
		d.epoch = 1
	}
	stamp, epoch := d.stamp[:n], d.epoch
	lo, hi := indexes[0], indexes[0]
	loV := d.Index(lo).ByteArray()
	hiV := loV
	stamp[lo] = epoch
	for _, id := range indexes[1:] {
		if stamp[id] == epoch {
			continue
		}
		stamp[id] = epoch
		v := d.Index(id).ByteArray()
		switch {
		case string(v) < string(loV):
			lo, loV = id, v
		case string(v) > string(hiV):
			hi, hiV = id, v
		}
	}
	return d.Index(lo), d.Index(hi)
}

// dictField is where a page buffer keeps its dictionary:
// indexedColumnBuffer.typ (*indexedType, promoted from indexedPage) and
// indexedType.dict.
type dictField struct {
	typ     reflect.Type // *parquet.indexedColumnBuffer
	typOff  uintptr      // of typ in the buffer struct
	dictOff uintptr      // of dict in indexedType
}

// dictFieldOf returns the dictionary field layout of buffer type t, ok
// false for any other layout.
func dictFieldOf(t reflect.Type) (dictField, bool) {
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct || t.Elem().Name() != "indexedColumnBuffer" || t.Elem().PkgPath() != pqPkg {
		return dictField{}, false
	}
	f, ok := t.Elem().FieldByName("typ")
	if !ok || f.Type.Kind() != reflect.Pointer || f.Type.Elem().Kind() != reflect.Struct ||
		f.Type.Elem().Name() != "indexedType" || f.Type.Elem().PkgPath() != pqPkg {
		return dictField{}, false
	}
	var off uintptr
	cur := t.Elem()
	for _, i := range f.Index {
		sf := cur.Field(i)
		off += sf.Offset
		cur = sf.Type
	}
	df, ok := f.Type.Elem().FieldByName("dict")
	if !ok || df.Type != reflect.TypeFor[pq.Dictionary]() || len(df.Index) != 1 {
		return dictField{}, false
	}
	return dictField{typ: t, typOff: off, dictOff: df.Offset}, true
}

// wrapBounds makes buf's dictionary a boundsDict (once per buffer type
// and dictionary); false when buf's layout is not the one read here or
// its dictionary not of byte arrays.
func (x *dictIndexer) wrapBounds(buf pq.ColumnBuffer) bool {
	t := reflect.TypeOf(buf)
	if !x.haveDict || t != x.dict.typ {
		f, ok := dictFieldOf(t)
		if !ok {
			return false
		}
		x.dict, x.haveDict = f, true
	}
	p := reflect.ValueOf(buf).UnsafePointer()
	typ := *(*unsafe.Pointer)(unsafe.Add(p, x.dict.typOff))
	if typ == nil {
		return false
	}
	d := (*pq.Dictionary)(unsafe.Add(typ, x.dict.dictOff))
	switch cur := (*d).(type) {
	case nil:
		return false
	case *boundsDict:
		return true
	default:
		if cur.Type().Kind() != pq.ByteArray {
			return false
		}
		*d = &boundsDict{Dictionary: cur}
		return true
	}
}
