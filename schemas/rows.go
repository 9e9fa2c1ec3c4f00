package schemas

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Chunk is one decoded record batch kept in its Arrow columns, in the
// order of the column table: what the collector carries from the wire to
// the Parquet column writers instead of row structs (columns → rows →
// columns cost the collector most of its CPU and memory). Its values
// alias the batch's Arrow buffers; nothing is copied per value.
type Chunk struct {
	t    *Table[Row]
	cols []chunkColumn
	n    int
	// agents interns agent_id: the sink keeps (agent_id, batch_seq) of
	// every file until it commits, and a string aliasing the batch would
	// keep the whole decoded message alive with it.
	agents []string
	// agentOf is the row's index into agents; nil while every row has
	// agents[0], as a batch of one agent does (the transport contract).
	agentOf  []uint16
	timeEnd  int // column positions of the identity fields, -1: none
	node     int
	agentCol int
	batchSeq int
	recIndex int
	// arena owns the Arrow buffers when a pooling decoder made the chunk
	// (bufpool.go); released once ReleaseRows let go of it.
	arena    *arena
	released atomic.Bool
}

type chunkColumn struct {
	kind columns.Kind
	i64  []int64
	i32  []int32
	offs []int32 // strings: value i is data[offs[i]-offs[0] : offs[i+1]-offs[0]]
	data []byte
	// keys: a dictionary-encoded string column's index per row (dict);
	// offs and data are then the dictionary's.
	dict bool
	keys dictKeys
}

// Row is one row of a Chunk, by reference (16 bytes). Rows sort, filter
// and partition like records; their values are read from the columns.
type Row struct {
	c *Chunk
	i int32
}

// FlowRows is flow.v1 decoded into Rows (DecoderFor(FlowRows)): the
// collector's working form.
var FlowRows = newRowTable(columns.SchemaName, columns.FlowMinor, columns.FlowV1, ParquetSchema)

// MeterRows is meter.v1 decoded into Rows.
var MeterRows = newRowTable(columns.MeterSchemaName, columns.MeterMinor, columns.MeterV1, MeterTable.ParquetSchema)

func newRowTable(name string, minor int, cols []columns.Column, pq func() *parquet.Schema) *Table[Row] {
	t := &Table[Row]{name: name, minor: minor, cols: cols, parquet: pq}
	t.decode = func(arrs []arrow.Array, idx []int, dst []Row) error { return decodeRows(t, arrs, idx, dst) }
	t.encode = func(rows []Row, id *Identity, form wireForm, _ *colArena) []wireColumn {
		return encodeRows(t, rows, id, form)
	}
	return t
}

func decodeRows(t *Table[Row], arrs []arrow.Array, idx []int, dst []Row) error {
	c := &Chunk{t: t, cols: make([]chunkColumn, len(t.cols)), n: len(dst), timeEnd: -1, node: -1, agentCol: -1, batchSeq: -1, recIndex: -1}
	for k, col := range t.cols {
		a := arrs[idx[k]]
		cc := chunkColumn{kind: col.Kind}
		switch col.Kind {
		case columns.Timestamp:
			ts, ok := a.(*array.Timestamp)
			if !ok {
				return fmt.Errorf("column %s: got %s, want timestamp[us]", col.Name, a.DataType())
			}
			v := ts.TimestampValues() // arrow.Timestamp is an int64
			cc.i64 = unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(v))), len(v))
		case columns.Int64:
			v, ok := a.(*array.Int64)
			if !ok {
				return fmt.Errorf("column %s: got %s, want int64", col.Name, a.DataType())
			}
			cc.i64 = v.Int64Values()
		case columns.Int32:
			v, ok := a.(*array.Int32)
			if !ok {
				return fmt.Errorf("column %s: got %s, want int32", col.Name, a.DataType())
			}
			cc.i32 = v.Int32Values()
		case columns.String:
			v, ok := a.(*array.String)
			if d, isDict := a.(*array.Dictionary); isDict {
				keys, dict, err := dictionaryKeys(col.Name, d, c.n)
				if err != nil {
					return err
				}
				v, ok, cc.dict, cc.keys = dict, true, true, keys
			}
			if !ok {
				return fmt.Errorf("column %s: got %s, want utf8 or dictionary<int32, utf8>", col.Name, a.DataType())
			}
			// Checked here: rows are read long after Decode returns,
			// beyond its recover.
			offs, data, err := stringData(col.Name, v)
			if err != nil {
				return err
			}
			cc.offs, cc.data = offs, data
		default:
			return fmt.Errorf("column %s: kind %d has no row form", col.Name, col.Kind)
		}
		if have := max(len(cc.i64), len(cc.i32), len(cc.offs)-1, cc.keys.len()); have < c.n {
			return fmt.Errorf("column %s: %d values for %d rows", col.Name, have, c.n)
		}
		c.cols[k] = cc
		switch col.Name {
		case "time_end":
			c.timeEnd = k
		case "node":
			c.node = k
		case "agent_id":
			c.agentCol = k
		case "batch_seq":
			c.batchSeq = k
		case "record_index":
			c.recIndex = k
		}
	}
	if c.agentCol >= 0 {
		if err := c.internAgents(); err != nil {
			return err
		}
	}
	for i := range dst {
		dst[i] = Row{c: c, i: int32(i)}
	}
	return nil
}

func (c *Chunk) internAgents() error {
	var last []byte
	for i := range c.n {
		v := c.cols[c.agentCol].bytes(i)
		if i > 0 && string(v) == string(last) {
			if c.agentOf != nil {
				c.agentOf[i] = c.agentOf[i-1]
			}
			continue
		}
		last = v
		k := -1
		for j, a := range c.agents {
			if a == string(v) {
				k = j
				break
			}
		}
		if k < 0 {
			if len(c.agents) == 1<<16-1 {
				return fmt.Errorf("column agent_id: more than %d distinct values in one batch", 1<<16-1)
			}
			k = len(c.agents)
			c.agents = append(c.agents, string(v))
		}
		if k > 0 && c.agentOf == nil {
			c.agentOf = make([]uint16, c.n) // rows before i: agents[0]
		}
		if c.agentOf != nil {
			c.agentOf[i] = uint16(k)
		}
	}
	return nil
}

func (cc *chunkColumn) bytes(i int) []byte {
	if cc.dict {
		i = cc.keys.at(i)
	}
	return cc.entry(i)
}

func (cc *chunkColumn) entry(k int) []byte {
	base := cc.offs[0]
	return cc.data[cc.offs[k]-base : cc.offs[k+1]-base]
}

// DictKeys returns the dictionary index of every row of a
// dictionary-encoded string column (aliasing int32 indices, else
// widened into a new slice; each checked in range), nil for a plain
// column or another kind. The entries are DictEntry(col, k), k <
// DictLen(col).
func (c *Chunk) DictKeys(col int) []int32 {
	if !c.cols[col].dict {
		return nil
	}
	return c.cols[col].keys.int32s()
}

// IsDict reports whether col is a dictionary-encoded string column
// (DictKeys would not be nil), without widening any indices.
func (c *Chunk) IsDict(col int) bool { return c.cols[col].dict }

// DictKeysInto is DictKeys with narrow indices widened into *buf (grown
// as needed and kept there) rather than a new slice, for callers that
// read every message's keys; int32 indices are aliased, *buf untouched.
func (c *Chunk) DictKeysInto(col int, buf *[]int32) []int32 {
	cc := &c.cols[col]
	if !cc.dict {
		return nil
	}
	return cc.keys.int32sInto(buf)
}

// DictLen is the number of dictionary entries of a dictionary-encoded
// string column (0 for a plain one).
func (c *Chunk) DictLen(col int) int {
	if !c.cols[col].dict {
		return 0
	}
	return len(c.cols[col].offs) - 1
}

// DictEntry is entry k of a dictionary-encoded string column; it aliases
// the batch's memory.
func (c *Chunk) DictEntry(col, k int) []byte { return c.cols[col].entry(k) }

// Len is the number of rows.
func (c *Chunk) Len() int { return c.n }

// Int64s returns the values of an int64 or timestamp column (table
// order); they alias the batch's memory. Nil for other kinds.
func (c *Chunk) Int64s(col int) []int64 { return c.cols[col].i64 }

// Int32s returns the values of an int32 column (table order); they alias
// the batch's memory. Nil for other kinds.
func (c *Chunk) Int32s(col int) []int32 { return c.cols[col].i32 }

// Chunk is the batch the row belongs to.
func (r Row) Chunk() *Chunk { return r.c }

// Index is the row's position in its chunk.
func (r Row) Index() int { return int(r.i) }

// Int64 is column col (table order) of an int64 or timestamp column.
func (r Row) Int64(col int) int64 { return r.c.cols[col].i64[r.i] }

// Int32 is column col of an int32 column.
func (r Row) Int32(col int) int32 { return r.c.cols[col].i32[r.i] }

// Bytes is column col of a string column; it aliases the batch's memory.
func (r Row) Bytes(col int) []byte { return r.c.cols[col].bytes(int(r.i)) }

// String is column col of a string column; it aliases the batch's memory
// (copy it to keep it beyond the batch).
func (r Row) String(col int) string {
	b := r.Bytes(col)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// TimeEnd is time_end (µs since the epoch; 0 without the column).
func (r Row) TimeEnd() int64 {
	if r.c.timeEnd < 0 {
		return 0
	}
	return r.Int64(r.c.timeEnd)
}

// Node is node, aliasing the batch's memory ("" without the column).
func (r Row) Node() string {
	if r.c.node < 0 {
		return ""
	}
	return r.String(r.c.node)
}

// AgentID is agent_id; it does not alias the batch's memory.
func (r Row) AgentID() string {
	if r.c.agentCol < 0 {
		return ""
	}
	if r.c.agentOf == nil {
		return r.c.agents[0]
	}
	return r.c.agents[r.c.agentOf[r.i]]
}

// BatchSeq is batch_seq (0 without the column).
func (r Row) BatchSeq() int64 {
	if r.c.batchSeq < 0 {
		return 0
	}
	return r.Int64(r.c.batchSeq)
}

// RecordIndex is record_index (0 without the column).
func (r Row) RecordIndex() int32 {
	if r.c.recIndex < 0 {
		return 0
	}
	return r.Int32(r.c.recIndex)
}

// encodeRows gathers rows (from any chunks, in any order) back into
// Arrow columns, for a subscriber re-publishing them or a test.
func encodeRows(t *Table[Row], rows []Row, id *Identity, form wireForm) []wireColumn {
	n := len(rows)
	out := make([]wireColumn, len(t.cols))
	for k, col := range t.cols {
		if id != nil {
			// The batch's identity, as the generated encoders write it.
			switch col.Name {
			case "agent_id":
				var d dictColumn
				d.reset(n, form, nil)
				d.fill(id.AgentID, n)
				out[k] = d.column()
				continue
			case "batch_seq":
				v := make([]int64, n)
				for i := range v {
					v[i] = id.BatchSeq
				}
				out[k] = int64Column(v)
				continue
			case "record_index":
				v := make([]int32, n)
				for i := range v {
					v[i] = int32(i)
				}
				out[k] = int32Column(v)
				continue
			}
		}
		switch col.Kind {
		case columns.Timestamp, columns.Int64:
			v := make([]int64, n)
			for i, r := range rows {
				v[i] = r.Int64(k)
			}
			if col.Kind == columns.Timestamp {
				out[k] = timestampColumn(v)
			} else {
				out[k] = int64Column(v)
			}
		case columns.Int32:
			v := make([]int32, n)
			for i, r := range rows {
				v[i] = r.Int32(k)
			}
			out[k] = int32Column(v)
		default:
			if col.Dict && form != formPlain {
				var d dictColumn
				d.reset(n, form, nil)
				for _, r := range rows {
					d.add(r.String(k))
				}
				out[k] = d.column()
				continue
			}
			var s stringColumn
			s.reset(n, 16)
			for _, r := range rows {
				s.data = append(s.data, r.Bytes(k)...)
				s.offsets = append(s.offsets, int32(len(s.data)))
			}
			out[k] = s.column()
		}
	}
	return out
}
