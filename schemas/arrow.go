package schemas

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
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
	encode func([]T, *Identity, wireForm, *colArena) []wireColumn
	decode func([]arrow.Array, []int, []T) error
	// parquet, when set, is the Parquet schema (row tables: T is not the
	// struct the files are laid out by).
	parquet func() *parquet.Schema

	once        sync.Once
	schema      *arrow.Schema
	plainSchema *arrow.Schema // every string utf8: the wire form before dictionaries
}

// wireForm is the wire form of Dict string columns.
type wireForm uint8

const (
	// formDict: dictionaries with the narrowest signed index type that
	// holds the message's dictionary (int8 up to 128 entries, int16 up to
	// 32768, else int32), chosen per column and message.
	formDict wireForm = iota
	// formPlain: plain utf8, the form of agents before wire dictionaries
	// (PlainStrings).
	formPlain
	// formWide: dictionaries with int32 indices whatever their size, the
	// form of agents before narrow indices (WideIndices).
	formWide
)

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
// Low-cardinality strings (Dict) are dictionary<int32, utf8> with one
// dictionary per message (messages narrow the indices: ToArrow); other
// strings are plain utf8; timestamps are
// µs UTC, counters int64. Decoders accept either string form for any
// string column (writers before wire dictionaries send utf8).
func (t *Table[T]) ArrowSchema() *arrow.Schema {
	t.once.Do(func() {
		fields := make([]arrow.Field, len(t.cols))
		plain := make([]arrow.Field, len(t.cols))
		for i, c := range t.cols {
			fields[i] = arrow.Field{Name: c.Name, Type: arrowType(c.Kind)}
			plain[i] = fields[i]
			if c.Kind == columns.String && c.Dict && !c.Addr {
				fields[i].Type = wireDictType
			}
		}
		md := arrow.NewMetadata([]string{MetadataKey, VersionKey}, []string{t.name, t.Version()})
		t.schema = arrow.NewSchema(fields, &md)
		t.plainSchema = arrow.NewSchema(plain, &md)
	})
	return t.schema
}

// PlainArrowSchema is ArrowSchema with every string column plain utf8:
// the wire form of writers before wire dictionaries (PlainStrings).
func (t *Table[T]) PlainArrowSchema() *arrow.Schema {
	t.ArrowSchema()
	return t.plainSchema
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

// ToArrow converts records to an Arrow record batch in the wire form:
// Dict columns' index types are the narrowest that hold each
// dictionary, so the batch's schema may differ from ArrowSchema in
// those. The caller releases it.
func (t *Table[T]) ToArrow(recs []T) arrow.RecordBatch { return t.toArrow(recs, nil, formDict, nil) }

// toArrow builds the batch in a's buffers (nil: fresh ones); the batch
// must be released before a is reused.
func (t *Table[T]) toArrow(recs []T, id *Identity, form wireForm, a *colArena) arrow.RecordBatch {
	cols := t.encode(recs, id, form, a)
	return array.NewRecordBatch(t.wireSchema(form, cols), arrays(cols), int64(len(recs)))
}

// wireSchema is the schema of a message of cols in form.
func (t *Table[T]) wireSchema(form wireForm, cols []wireColumn) *arrow.Schema {
	switch form {
	case formPlain:
		t.ArrowSchema()
		return t.plainSchema
	}
	return narrowSchema(t.ArrowSchema(), cols)
}

// narrowSchema is sc with the types cols send: their dictionaries'
// index types, and utf8 or a dictionary as an IP column (ipColumn)
// sends it in this message.
func narrowSchema(sc *arrow.Schema, cols []wireColumn) *arrow.Schema {
	fields := sc.Fields()
	for i, c := range cols {
		if fields[i].Type.ID() == arrow.DICTIONARY || c.typ.ID() == arrow.DICTIONARY {
			fields[i].Type = c.typ
		}
	}
	md := sc.Metadata()
	return arrow.NewSchema(fields, &md)
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

// wireDictType is the declared type of Dict string columns (ArrowSchema):
// int32 indices, Arrow's default, cover any batch size. Messages carry
// narrower indices where the dictionary allows (formDict); readers take
// any signed index type.
var wireDictType = &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: arrow.BinaryTypes.String}

var (
	dictInt8  = &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int8, ValueType: arrow.BinaryTypes.String}
	dictInt16 = &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int16, ValueType: arrow.BinaryTypes.String}
)

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

// colArena lends the column buffers of one message and takes them back
// once it is written (EncoderOf keeps a pool): a 16384-record flow batch
// needs about 2.5 MB of them, which fresh would cost allocation, zeroing
// and GC work per message. Buffers are handed out in call order, so one
// table's messages get the same buffers back; every element handed out
// is written before it is read. A nil arena allocates.
type colArena struct {
	i64          [][]int64
	i32          [][]int32
	bytes        [][]byte
	n64, n32, nb int
	// Dictionaries' value slices, handed back cleared (an idle arena
	// keeps no record's strings alive), and their MAC maps, cleared
	// when the next message takes them (they hold no pointers).
	strs   [][]string
	macs   []map[uint64]int32
	ns, nm int
	// ips are the address tables of IP columns (ipColumn).
	ips [][]ipSlot
	nip int
	// ipc writes the message from these buffers (ipcwrite.go).
	ipc ipcWriter
}

func (a *colArena) reset() { a.n64, a.n32, a.nb, a.ns, a.nm, a.nip = 0, 0, 0, 0, 0, 0 }

// ipTable is an empty address table of n slots (a power of two).
func (a *colArena) ipTable(n int) []ipSlot {
	if a == nil {
		return make([]ipSlot, n)
	}
	if a.nip == len(a.ips) {
		a.ips = append(a.ips, nil)
	}
	t := &a.ips[a.nip]
	a.nip++
	if cap(*t) < n {
		*t = make([]ipSlot, n)
	}
	*t = (*t)[:n]
	clear(*t)
	return *t
}

// strings is an empty value slice for a dictionary and its slot, for
// keepStrings.
func (a *colArena) strings() ([]string, int32) {
	if a == nil {
		return nil, -1
	}
	if a.ns == len(a.strs) {
		a.strs = append(a.strs, nil)
	}
	a.ns++
	return a.strs[a.ns-1][:0], int32(a.ns - 1)
}

// keepStrings clears v, the values lent as slot k (they may have
// outgrown it), and keeps it for the next message.
func (a *colArena) keepStrings(k int32, v []string) {
	clear(v)
	if a != nil && k >= 0 && cap(v) > cap(a.strs[k]) {
		a.strs[k] = v[:0]
	}
}

// macMap is an empty map for a dictionary's MACs; the arena clears it
// when the next message takes it.
func (a *colArena) macMap() map[uint64]int32 {
	if a == nil {
		return make(map[uint64]int32, 16)
	}
	if a.nm == len(a.macs) {
		a.macs = append(a.macs, make(map[uint64]int32, 16))
	}
	a.nm++
	m := a.macs[a.nm-1]
	clear(m)
	return m
}

func (a *colArena) int64s(n int) []int64 {
	if a == nil {
		return make([]int64, n)
	}
	return lend(&a.i64, &a.n64, n)
}

func (a *colArena) int32s(n int) []int32 {
	if a == nil {
		return make([]int32, n)
	}
	return lend(&a.i32, &a.n32, n)
}

// lend is the next of bufs (the *next-th), n long.
func lend[E int32 | int64](bufs *[][]E, next *int, n int) []E {
	if *next == len(*bufs) {
		*bufs = append(*bufs, nil)
	}
	s := &(*bufs)[*next]
	*next++
	if cap(*s) < n {
		*s = make([]E, n)
	}
	return (*s)[:n]
}

// byteBuf is an empty buffer of capacity n or more and its slot, for
// keep.
func (a *colArena) byteBuf(n int) ([]byte, int) {
	if a == nil {
		return make([]byte, 0, n), -1
	}
	if a.nb == len(a.bytes) {
		a.bytes = append(a.bytes, nil)
	}
	k := a.nb
	a.nb++
	if cap(a.bytes[k]) < n {
		a.bytes[k] = make([]byte, 0, n)
	}
	return a.bytes[k][:0], k
}

// keep stores a buffer that outgrew its slot k, for the next message.
func (a *colArena) keep(k int, b []byte) {
	if a != nil && k >= 0 && cap(b) > cap(a.bytes[k]) {
		a.bytes[k] = b[:0]
	}
}

// stringColumn builds a utf8 array from one offsets and one data buffer.
type stringColumn struct {
	offsets []int32
	data    []byte
	arena   *colArena
	slot    int // data's in arena
}

func (s *stringColumn) reset(n, avg int) { s.resetIn(nil, n, avg) }

func (s *stringColumn) resetIn(a *colArena, n, avg int) {
	s.offsets = a.int32s(n + 1)[:1]
	s.offsets[0] = 0
	s.data, s.slot = a.byteBuf(n * avg)
	s.arena = a
}

func (s *stringColumn) add(v string) {
	s.data = append(s.data, v...)
	s.offsets = append(s.offsets, int32(len(s.data)))
}

func (s *stringColumn) column() wireColumn {
	s.arena.keep(s.slot, s.data)
	return utf8Column(s.offsets, s.data)
}

// dictColumn builds a dictionary<int*, utf8> array: the distinct values
// once, and one index per row. The agent's strings of one batch are
// mostly the same few (node, agent_id, one tenant's ids), often the
// same pointers, so the last value's pointer and length are checked
// first and small dictionaries are scanned (string equality compares
// pointers first) before a map is built.
type dictColumn struct {
	form    wireForm     // formPlain: build utf8 in s instead
	s       stringColumn // plain
	arena   *colArena    // lends keys and the dictionary's buffers
	keys    []int32
	vals    []string // the dictionary; aliases the caller's strings
	index   map[string]int32
	lastPtr *byte
	lastLen int
	lastKey int32
	// valSlot is the arena's slot of vals. Slots are int32 in the
	// padding after the keys: the encoders keep ~20 of these on the
	// stack, and a larger struct measured slower (BenchmarkFlowEncode).
	valSlot int32
	// prev is the value before last (a column alternating between two
	// values, as direction does, answers from these two).
	prevPtr *byte
	prevLen int
	prevKey int32
	// textSlot is the arena's slot of macText's first block.
	textSlot int32
	// macs keys binary MACs (FlowBin) to their entry, so a batch formats
	// each distinct MAC once; macText holds those texts.
	macs      map[uint64]int32
	lastMAC   uint64
	lastIsMAC bool // the last value came through addMAC
	// sawText: a value came through add. Until then every entry is the
	// text of a distinct binary MAC, so a new MAC's text is new to the
	// dictionary without a lookup; from then on it is looked up, as a
	// text value may already hold it.
	sawText bool
	macText []byte
	// cache answers repeated values before the maps do, once the
	// dictionary is past dictScan: the records' strings point into the
	// attribution snapshot (one pointer per tenant, server, port) and
	// the same MACs recur, so a pointer or a MAC finds its entry without
	// hashing a string.
	cache *dictCache
}

// dictCache is a direct-mapped cache of dictionary entries by string
// (pointer, length) and by binary MAC, for one message. A pointer and
// length name the same bytes for the whole message (strings are
// immutable; the MAC texts are never rewritten), as the last-value check
// already assumes. Its tables grow with the dictionary (at most 4 slots
// a value, up to dictCacheMax) and are kept in a pool between messages;
// entries of another message have another gen.
type dictCache struct {
	gen   uint32
	str   []strSlot
	mac   []macSlot
	index map[string]int32 // a column's string map, kept (cleared) for the next message
}

// strSlot keys by address, not pointer: a pooled cache must not keep
// strings of past messages alive. Within a message the string is alive
// (a record holds it) and the heap does not move.
type strSlot struct {
	p    uintptr
	n, k int32
	gen  uint32
}

type macSlot struct {
	v      uint64
	k, gen uint32
}

const dictCacheMax = 1 << 14

var dictCaches = sync.Pool{New: func() any { return new(dictCache) }}

func newDictCache() *dictCache {
	d := dictCaches.Get().(*dictCache)
	if d.gen++; d.gen == 0 { // wrapped: old entries could look current
		clear(d.str)
		clear(d.mac)
		d.gen = 1
	}
	return d
}

// size is the table size for n dictionary values: a power of two, 4
// slots a value, within [256, dictCacheMax]; cur when that is enough.
func dictCacheSize(cur, n int) int {
	if cur >= dictCacheMax || cur >= 2*n {
		return cur
	}
	want := 256
	for want < 4*n && want < dictCacheMax {
		want *= 2
	}
	return want
}

func dictSlot(x uint64, size int) uint64 {
	return (x * 0x9E3779B97F4A7C15) >> (64 - bits.TrailingZeros(uint(size)))
}

// release returns the cache to the pool, with the column's string map
// cleared (it keeps its size, not the strings).
func (c *dictColumn) release() {
	if c.cache != nil {
		if c.index != nil {
			clear(c.index)
			c.cache.index = c.index
		}
		dictCaches.Put(c.cache)
		c.cache = nil
	}
}

// dictScan is the dictionary size up to which add scans instead of
// hashing.
const dictScan = 8

// fill adds v n times: a column with one value for the whole message.
func (c *dictColumn) fill(v string, n int) {
	if n == 0 {
		return
	}
	if c.form == formPlain {
		for range n {
			c.s.add(v)
		}
		return
	}
	k := c.add(v)
	for range n - 1 {
		c.keys = append(c.keys, k)
	}
}

func (c *dictColumn) reset(n int, form wireForm, a *colArena) {
	c.form = form
	if form == formPlain {
		c.s.resetIn(a, n, 16)
		return
	}
	c.arena = a
	c.keys = a.int32s(n)[:0]
	c.vals, c.valSlot = a.strings()
	c.release()
	c.index = nil
	c.lastPtr, c.lastLen, c.prevPtr, c.prevLen = nil, -1, nil, -1
	c.macs, c.macText, c.textSlot, c.lastIsMAC, c.sawText = nil, nil, -1, false, false
}

// addMAC adds a binary MAC (FlowBin form): its text is formatted once per
// distinct MAC in the message, not per row.
func (c *dictColumn) addMAC(v uint64) int32 {
	if c.form == formPlain {
		c.s.addMAC(v)
		return 0
	}
	if c.macs == nil {
		c.macs = c.arena.macMap()
	} else if c.lastIsMAC && v == c.lastMAC {
		c.keys = append(c.keys, c.lastKey)
		return c.lastKey
	}
	var sl *macSlot
	if len(c.macs) > dictScan {
		if c.cache == nil {
			c.cache = newDictCache()
		}
		d := c.cache
		if n := dictCacheSize(len(d.mac), len(c.macs)); n != len(d.mac) {
			d.mac = make([]macSlot, n)
		}
		if sl = &d.mac[dictSlot(v, len(d.mac))]; sl.gen == d.gen && sl.v == v {
			c.lastPtr, c.lastLen, c.lastKey, c.lastMAC, c.lastIsMAC = nil, -1, int32(sl.k), v, true
			c.keys = append(c.keys, int32(sl.k))
			return int32(sl.k)
		}
	}
	k, ok := c.macs[v]
	if !ok {
		start := len(c.macText)
		if cap(c.macText)-start < 17 {
			// A new block, never an append that moves the bytes: the
			// dictionary's strings alias the texts written so far. The
			// first is the arena's; the last, the largest, goes back to
			// it (column).
			if c.textSlot < 0 && c.arena != nil {
				var k int
				c.macText, k = c.arena.byteBuf(64 * 17)
				c.textSlot = int32(k)
			} else {
				c.macText = make([]byte, 0, max(64*17, 2*cap(c.macText)))
			}
			start = 0
		}
		c.macText = AppendMAC(c.macText, v)
		text := unsafe.String(&c.macText[start], 17)
		if c.sawText {
			k = c.lookup(text)
		} else {
			k = int32(len(c.vals))
			c.vals = append(c.vals, text)
		}
		c.macs[v] = k
	}
	if sl != nil {
		sl.v, sl.k, sl.gen = v, uint32(k), c.cache.gen
	}
	c.lastPtr, c.lastLen, c.lastKey, c.lastMAC, c.lastIsMAC = nil, -1, k, v, true
	c.keys = append(c.keys, k)
	return k
}

// add appends v's key and returns it (0 in the plain form).
func (c *dictColumn) add(v string) int32 {
	if c.form == formPlain {
		c.s.add(v)
		return 0
	}
	if !c.sawText {
		c.sawText = true
		if c.index == nil && len(c.vals) > dictScan { // MACs went in unindexed
			c.buildIndex()
		}
	}
	p := unsafe.StringData(v)
	if p == c.lastPtr && len(v) == c.lastLen {
		c.keys = append(c.keys, c.lastKey)
		return c.lastKey
	}
	if p == c.prevPtr && len(v) == c.prevLen {
		k := c.prevKey
		c.prevPtr, c.prevLen, c.prevKey = c.lastPtr, c.lastLen, c.lastKey
		c.lastPtr, c.lastLen, c.lastKey = p, len(v), k
		c.keys = append(c.keys, k)
		return k
	}
	var k int32
	if c.index == nil || p == nil { // small dictionary: the scan is as cheap
		k = c.lookup(v)
	} else {
		if c.cache == nil {
			c.cache = newDictCache()
		}
		d := c.cache
		if n := dictCacheSize(len(d.str), len(c.vals)); n != len(d.str) {
			d.str = make([]strSlot, n)
		}
		a := uintptr(unsafe.Pointer(p))
		sl := &d.str[dictSlot(uint64(a)^uint64(len(v)), len(d.str))]
		if sl.gen == d.gen && sl.p == a && int(sl.n) == len(v) {
			k = sl.k
		} else {
			k = c.lookup(v)
			*sl = strSlot{p: a, n: int32(len(v)), k: k, gen: d.gen}
		}
	}
	c.prevPtr, c.prevLen, c.prevKey = c.lastPtr, c.lastLen, c.lastKey
	c.lastPtr, c.lastLen, c.lastKey, c.lastIsMAC = p, len(v), k, false
	c.keys = append(c.keys, k)
	return k
}

func (c *dictColumn) lookup(v string) int32 {
	if c.index == nil {
		for k, d := range c.vals {
			if d == v {
				return int32(k)
			}
		}
		k := int32(len(c.vals))
		c.vals = append(c.vals, v)
		if len(c.vals) > dictScan {
			c.buildIndex()
		}
		return k
	}
	if k, ok := c.index[v]; ok {
		return k
	}
	k := int32(len(c.vals))
	c.vals = append(c.vals, v)
	c.index[v] = k
	return k
}

// buildIndex maps every dictionary value to its key: past dictScan
// values a map answers instead of the scan.
func (c *dictColumn) buildIndex() {
	if c.cache == nil {
		c.cache = newDictCache()
	}
	c.index, c.cache.index = c.cache.index, nil
	if c.index == nil {
		c.index = make(map[string]int32, 2*len(c.vals))
	}
	for k, d := range c.vals {
		c.index[d] = int32(k)
	}
}

func (c *dictColumn) column() wireColumn {
	if c.form == formPlain {
		return c.s.column()
	}
	size := 0
	for _, v := range c.vals {
		size += len(v)
	}
	var d stringColumn
	d.offsets = c.arena.int32s(len(c.vals) + 1)[:1]
	d.offsets[0] = 0
	d.data, _ = c.arena.byteBuf(size)
	for _, v := range c.vals {
		d.add(v)
	}
	dt, keys := c.indices()
	c.release() // clears the map: no record's strings kept alive
	c.arena.keepStrings(c.valSlot, c.vals)
	c.arena.keep(int(c.textSlot), c.macText)
	c.vals, c.index, c.macs, c.macText = nil, nil, nil, nil
	return wireColumn{typ: dt, n: len(c.keys), vals: keys, offs: arrow.Int32Traits.CastToBytes(d.offsets), data: d.data, dictLen: len(d.offsets) - 1}
}

// indices is the dictionary type and index array of the column: keys
// narrowed in place (each index is read before its bytes are written
// over) to the narrowest type that holds the dictionary (formDict).
func (c *dictColumn) indices() (*arrow.DictionaryType, []byte) {
	return narrowKeys(c.keys, len(c.vals), c.form)
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
		return c.column().array()
	case columns.Int32:
		return int32Column(make([]int32, n)).array()
	case columns.Timestamp:
		return timestampColumn(make([]int64, n)).array()
	}
	return int64Column(make([]int64, n)).array()
}

// strCol reads a string column of either wire form: plain utf8 (data,
// offs) or a dictionary (keys into vals). Decoded strings never point into
// Arrow memory.
type strCol struct {
	data string
	offs []int32
	dict bool // keys into vals, else plain
	keys dictKeys
	vals []string
}

func (s *strCol) at(i int) string {
	if s.dict {
		return s.vals[s.keys.at(i)]
	}
	return s.data[s.offs[i]-s.offs[0] : s.offs[i+1]-s.offs[0]]
}

// stringsOf opens column name (n rows) as utf8 or dictionary<int, utf8>,
// offsets and indices checked.
func stringsOf(name string, a arrow.Array, n int) (strCol, error) {
	switch a := a.(type) {
	case *array.String:
		if a.Len() < n {
			return strCol{}, fmt.Errorf("column %s: %d values for %d rows", name, a.Len(), n)
		}
		d, o, err := columnString(name, a)
		if err != nil {
			return strCol{}, err
		}
		return strCol{data: d, offs: o}, nil
	case *array.Dictionary:
		keys, dict, err := dictionaryKeys(name, a, n)
		if err != nil {
			return strCol{}, err
		}
		d, o, err := columnString(name, dict)
		if err != nil {
			return strCol{}, err
		}
		vals := make([]string, dict.Len())
		for k := range vals {
			vals[k] = d[o[k]-o[0] : o[k+1]-o[0]]
		}
		return strCol{dict: true, keys: keys, vals: vals}, nil
	}
	return strCol{}, fmt.Errorf("column %s: got %s, want utf8 or dictionary<int32, utf8>", name, a.DataType())
}

// maxDictSlack is how many entries a dictionary may hold beyond its
// batch's rows: tapflow's writers send only used values, stock writers
// may send a few unused ones (a sliced table); more is refused.
const maxDictSlack = 4096

// DictionaryStrings validates a dictionary-encoded string column of n rows
// and returns its indices as int32 (aliasing the batch for int32 indices)
// and its utf8 dictionary. It refuses a dictionary of another value type,
// nulls in the indices or the dictionary, an index out of range and a
// dictionary with more than maxDictSlack entries beyond n: clear errors,
// never a panic.
func DictionaryStrings(name string, a *array.Dictionary, n int) ([]int32, *array.String, error) {
	keys, dict, err := dictionaryKeys(name, a, n)
	return keys.int32s(), dict, err
}

// dictKeys are a dictionary column's indices, checked in range: int8 and
// int16 ones (tapflow's narrow wire form) as the batch holds them, not
// widened into a copy per message; others as int32.
type dictKeys struct {
	k8  []int8
	k16 []int16
	k32 []int32
}

func (d *dictKeys) at(i int) int {
	switch {
	case d.k8 != nil:
		return int(d.k8[i])
	case d.k16 != nil:
		return int(d.k16[i])
	}
	return int(d.k32[i])
}

func (d *dictKeys) len() int { return max(len(d.k8), len(d.k16), len(d.k32)) }

// int32s is the indices as int32: k32 itself, or a widened copy.
func (d *dictKeys) int32s() []int32 {
	switch {
	case d.k8 != nil:
		return widen(d.k8)
	case d.k16 != nil:
		return widen(d.k16)
	}
	return d.k32
}

// int32sInto is int32s widening into *buf instead of a new slice.
func (d *dictKeys) int32sInto(buf *[]int32) []int32 {
	switch {
	case d.k8 != nil:
		return widenInto(buf, d.k8)
	case d.k16 != nil:
		return widenInto(buf, d.k16)
	}
	return d.k32
}

func widenInto[K int8 | int16](buf *[]int32, v []K) []int32 {
	out := slices.Grow((*buf)[:0], len(v))[:len(v)]
	for i, k := range v {
		out[i] = int32(k)
	}
	*buf = out
	return out
}

// dictionaryKeys is DictionaryStrings with the indices in their own width
// where that is int8 or int16.
func dictionaryKeys(name string, a *array.Dictionary, n int) (dictKeys, *array.String, error) {
	dt, _ := a.DataType().(*arrow.DictionaryType)
	dict, ok := a.Dictionary().(*array.String)
	if !ok || dt == nil {
		return dictKeys{}, nil, fmt.Errorf("column %s: got %s, want dictionary<int32, utf8> (or plain utf8)", name, a.DataType())
	}
	m := dict.Len()
	if m > n+maxDictSlack {
		return dictKeys{}, nil, fmt.Errorf("column %s: dictionary of %d entries for %d rows (at most %d beyond the rows)", name, m, n, maxDictSlack)
	}
	if a.NullN() > 0 || dict.NullN() > 0 {
		return dictKeys{}, nil, fmt.Errorf("column %s: nulls in the dictionary or its indices; tapflow columns are not nullable", name)
	}
	if a.Len() < n {
		return dictKeys{}, nil, fmt.Errorf("column %s: %d values for %d rows", name, a.Len(), n)
	}
	var keys dictKeys
	var err error
	switch ix := a.Indices().(type) {
	case *array.Int32:
		keys.k32 = ix.Int32Values()[:n]
		err = checkKeys(name, keys.k32, m)
	case *array.Int16:
		keys.k16 = ix.Int16Values()[:n]
		err = checkKeys(name, keys.k16, m)
	case *array.Int8:
		keys.k8 = ix.Int8Values()[:n]
		err = checkKeys(name, keys.k8, m)
	case *array.Uint8:
		keys.k32 = widen(ix.Uint8Values()[:n])
		err = checkKeys(name, keys.k32, m)
	case *array.Uint16:
		keys.k32 = widen(ix.Uint16Values()[:n])
		err = checkKeys(name, keys.k32, m)
	case *array.Int64:
		v := ix.Int64Values()[:n]
		if err = checkKeys(name, v, m); err == nil {
			keys.k32 = make([]int32, n)
			for i, k := range v {
				keys.k32[i] = int32(k)
			}
		}
	default:
		return dictKeys{}, nil, fmt.Errorf("column %s: dictionary index type %s; use int8, int16, int32, int64, uint8 or uint16", name, dt.IndexType)
	}
	if err != nil {
		return dictKeys{}, nil, err
	}
	if keys.k8 == nil && keys.k16 == nil && keys.k32 == nil {
		keys.k32 = []int32{} // no rows: still a dictionary column
	}
	return keys, dict, nil
}

func checkKeys[K int8 | int16 | int32 | int64](name string, keys []K, m int) error {
	for i, k := range keys {
		if k < 0 || int64(k) >= int64(m) {
			return fmt.Errorf("column %s: row %d: dictionary index %d out of range [0, %d)", name, i, k, m)
		}
	}
	return nil
}

func widen[K int8 | int16 | uint8 | uint16](v []K) []int32 {
	out := make([]int32, len(v))
	for i, k := range v {
		out[i] = int32(k)
	}
	return out
}

// columnString copies the character data of a utf8 array into one Go
// string (one allocation per column per batch) and returns it with the
// value offsets (checked: stringData); value i is
// data[offs[i]-offs[0] : offs[i+1]-offs[0]].
func columnString(name string, c *array.String) (string, []int32, error) {
	offs, data, err := stringData(name, c)
	if err != nil {
		return "", nil, err
	}
	return string(data), offs, nil
}

// stringData returns the value offsets of a utf8 array (Len()+1 of them)
// and the bytes from the first to the last, after checking that the
// offsets start at 0 or more, never decrease and end within the data
// buffer. arrow-go checks only the last one, and a hostile message's
// other offsets would panic wherever a value is sliced — in the
// collector, long after the decode — or read another value's bytes.
func stringData(name string, c *array.String) ([]int32, []byte, error) {
	d := c.Data()
	n, off := d.Len(), d.Offset()
	if n == 0 {
		return []int32{0}, nil, nil
	}
	bufs := d.Buffers()
	if len(bufs) < 3 || bufs[1] == nil {
		return nil, nil, fmt.Errorf("column %s: %d values without value offsets", name, n)
	}
	all := arrow.Int32Traits.CastFromBytes(bufs[1].Bytes())
	if off < 0 || len(all) < off+n+1 {
		return nil, nil, fmt.Errorf("column %s: %d value offsets for %d values", name, len(all), n)
	}
	offs := all[off : off+n+1]
	var vals []byte
	if bufs[2] != nil {
		vals = bufs[2].Bytes()
	}
	if offs[0] < 0 {
		return nil, nil, fmt.Errorf("column %s: first value offset %d", name, offs[0])
	}
	for i := 1; i <= n; i++ {
		if offs[i] < offs[i-1] {
			return nil, nil, fmt.Errorf("column %s: value %d: offset %d after %d; offsets must not decrease", name, i-1, offs[i], offs[i-1])
		}
	}
	if int(offs[n]) > len(vals) {
		return nil, nil, fmt.Errorf("column %s: value offsets end at %d, beyond the %d-byte data buffer", name, offs[n], len(vals))
	}
	return offs, vals[offs[0]:offs[n]], nil
}
