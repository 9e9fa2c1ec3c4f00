package parquet

import (
	"fmt"
	"io"
	"slices"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/schemas/columns"
)

// FlowRowSchema writes flow.v1 from schemas.Row (schemas.FlowRows: decoded
// messages kept in their Arrow columns) into the same files as
// FlowSchema: the collector's path. Values go from the Arrow buffers
// straight into the Parquet column writers; no row struct is built.
var FlowRowSchema = rowSchema(FlowSchema, schemas.FlowRows)

// MeterRowSchema writes meter.v1 from schemas.Row (schemas.MeterRows).
var MeterRowSchema = rowSchema(MeterSchema, schemas.MeterRows)

func rowSchema[T any](like Schema[T], t *schemas.Table[schemas.Row]) Schema[schemas.Row] {
	return Schema[schemas.Row]{
		Name:           like.Name,
		Version:        like.Version,
		Dir:            like.Dir,
		TimeEnd:        func(r *schemas.Row) int64 { return r.TimeEnd() },
		SkipPageBounds: like.SkipPageBounds,
		Identity:       func(r *schemas.Row) (string, int64) { return r.AgentID(), r.BatchSeq() },
		rows:           t,
	}
}

// fileWriter is what a file is written with: a GenericWriter[T] for
// record structs, a columnWriter for schemas.Row.
type fileWriter[T any] interface {
	Write(rows []T) (int, error)
	Flush() error
	Close() error
	SetKeyValueMetadata(key, value string)
}

func (s *Sink[T]) newFileWriter(out io.Writer) fileWriter[T] {
	if s.schema.rows == nil {
		return pq.NewGenericWriter[T](out, s.wopts...)
	}
	cw := newColumnWriter(out, s.schema.rows, s.wopts)
	cw.valuePath = s.valuePath
	w, _ := any(cw).(fileWriter[T])
	return w
}

// columnWriter writes rows column by column through the Parquet writer's
// column writers (the schema of the table's record struct, so the files
// are the same as GenericWriter's). Values are built in a recycled
// buffer of columnStep rows; byte arrays point into the Arrow buffers
// (the column writers copy them into their pages and dictionaries).
// Dictionary-encoded wire columns go into Parquet dictionary columns as
// indices, integers into the page buffers as slices (dictindex.go),
// unless valuePath.
type columnWriter struct {
	w      *pq.GenericWriter[any]
	colOf  []int // Parquet leaf column → table column
	kinds  []columns.Kind
	vals   []pq.Value
	ix     dictIndexer
	remaps []remap // per Parquet leaf column
	one    [1]pq.Value
	i64    []int64
	i32    []int32
	// pageIndices is the most ids a dictionary page holds before its
	// cut: the page buffer's size in int32 ids plus one step, which
	// WriteRowValues may add past the limit before it cuts.
	pageIndices int
	// valuePath writes every value as a pq.Value (dictionary columns
	// through Dictionary.Insert): the path the direct paths are checked
	// against.
	valuePath bool
}

// remap maps one message's dictionary keys of a column to the row
// group's dictionary ids (-1: not inserted yet). It lives for one Write:
// the row group's dictionary is reset only by Flush or Close.
type remap struct {
	chunk *schemas.Chunk
	keys  []int32
	ids   []int32
	wide  []int32 // narrow wire indices widened, reused across messages
}

func (m *remap) reset(c *schemas.Chunk, col int) {
	m.chunk, m.keys = c, c.DictKeysInto(col, &m.wide)
	n := c.DictLen(col)
	if cap(m.ids) < n {
		m.ids = make([]int32, n)
	}
	m.ids = m.ids[:n]
	for i := range m.ids {
		m.ids[i] = -1
	}
}

const columnStep = 4096

func newColumnWriter(out io.Writer, t *schemas.Table[schemas.Row], wopts []pq.WriterOption) *columnWriter {
	sch := t.ParquetSchema()
	w := pq.NewGenericWriter[any](out, append([]pq.WriterOption{sch}, wopts...)...)
	cw := &columnWriter{w: w, vals: make([]pq.Value, 0, columnStep), ix: newDictIndexer()}
	pageBytes := pq.DefaultPageBufferSize
	if cfg, err := pq.NewWriterConfig(wopts...); err == nil {
		pageBytes = cfg.PageBufferSize
	}
	cw.pageIndices = pageBytes/4 + columnStep
	pos := map[string]int{}
	for k, c := range t.Columns() {
		pos[c.Name] = k
	}
	for _, path := range sch.Columns() {
		k, ok := pos[path[0]]
		if !ok || len(path) != 1 {
			panic(fmt.Sprintf("parquet sink: column %v of %s is not in its column table", path, t.Name()))
		}
		cw.colOf = append(cw.colOf, k)
		cw.kinds = append(cw.kinds, t.Columns()[k].Kind)
	}
	cw.remaps = make([]remap, len(cw.colOf))
	return cw
}

// Write writes whole rows: every column gets the same rows, so a row
// group holds complete rows whenever the sink flushes it.
func (c *columnWriter) Write(rows []schemas.Row) (int, error) {
	cws := c.w.ColumnWriters()
	for start := 0; start < len(rows); start += columnStep {
		part := rows[start:min(start+columnStep, len(rows))]
		run, lo := runOf(part)
		for p, cw := range cws {
			k := c.colOf[p]
			v := c.vals[:0]
			var err error
			switch c.kinds[p] {
			case columns.Timestamp, columns.Int64:
				if w, ok := c.direct(cw).(pq.Int64Writer); ok {
					err = writeInts(w.WriteInt64s, part, run, lo, k, (*schemas.Chunk).Int64s, schemas.Row.Int64, &c.i64)
					break // v empty: the page cut below
				}
				for _, r := range part {
					v = append(v, pq.Int64Value(r.Int64(k)))
				}
			case columns.Int32:
				if w, ok := c.direct(cw).(pq.Int32Writer); ok {
					err = writeInts(w.WriteInt32s, part, run, lo, k, (*schemas.Chunk).Int32s, schemas.Row.Int32, &c.i32)
					break
				}
				for _, r := range part {
					v = append(v, pq.Int32Value(r.Int32(k)))
				}
			default:
				if c.writeIndices(cw, p, k, part, run, lo) {
					break
				}
				for _, r := range part {
					v = append(v, pq.ByteArrayValue(r.Bytes(k)))
				}
			}
			// With v empty (the direct paths): only the page cut
			// WriteRowValues makes after each call. Never nil: parquet-go
			// offsets the slice's pointer (checkptr refuses nil).
			if err == nil {
				_, err = cw.WriteRowValues(v)
			}
			if err != nil {
				c.release()
				return start, fmt.Errorf("column %d: %w", p, err)
			}
		}
	}
	c.release()
	return len(rows), nil
}

// writeInts writes column k of part with one call of write: the
// message's own values when part is a run of it (run, from lo), else
// gathered into scratch.
func writeInts[V int32 | int64](write func([]V) (int, error), part []schemas.Row, run *schemas.Chunk, lo, k int,
	vals func(*schemas.Chunk, int) []V, val func(schemas.Row, int) V, scratch *[]V) error {
	if run != nil {
		_, err := write(vals(run, k)[lo : lo+len(part)])
		return err
	}
	src := (*scratch)[:0]
	for _, r := range part {
		src = append(src, val(r, k))
	}
	*scratch = src
	_, err := write(src)
	return err
}

// writeIndices appends part's dictionary ids to cw's page, inserting each
// message entry once; false (nothing written) unless every row's column
// is dictionary-encoded on the wire and cw's page is a dictionary page.
// run and lo are runOf(part).
func (c *columnWriter) writeIndices(cw *pq.ColumnWriter, p, k int, part []schemas.Row, run *schemas.Chunk, lo int) bool {
	if c.valuePath {
		return false
	}
	if run != nil {
		if !run.IsDict(k) {
			return false
		}
	} else {
		var last *schemas.Chunk
		for _, r := range part {
			if ch := r.Chunk(); ch != last {
				if !ch.IsDict(k) {
					return false
				}
				last = ch
			}
		}
	}
	idx, dict := c.ix.slot(cw)
	if idx == nil {
		return false
	}
	m := &c.remaps[p]
	out := *idx
	if need := len(out) + len(part); need > cap(out) {
		// Grown once to a whole page: append's small steps would
		// allocate the page's ids several times over.
		out = slices.Grow(out, max(need, c.pageIndices)-len(out))
	}
	if run != nil {
		if m.chunk != run {
			m.reset(run, k)
		}
		for _, key := range m.keys[lo : lo+len(part)] {
			id := m.ids[key]
			if id < 0 {
				id = c.insert(dict, m, k, key)
			}
			out = append(out, id)
		}
	} else {
		for _, r := range part {
			if ch := r.Chunk(); ch != m.chunk {
				m.reset(ch, k)
			}
			key := m.keys[r.Index()]
			id := m.ids[key]
			if id < 0 {
				id = c.insert(dict, m, k, key)
			}
			out = append(out, id)
		}
	}
	*idx = out
	return true
}

// insert puts entry key of m's message into the row group's dictionary
// and returns its id.
func (c *columnWriter) insert(dict pq.Dictionary, m *remap, k int, key int32) int32 {
	c.one[0] = pq.ByteArrayValue(m.chunk.DictEntry(k, int(key)))
	dict.Insert(m.ids[key:key+1], c.one[:])
	return m.ids[key]
}

// direct is cw's page buffer for the integer paths, nil on the value path.
func (c *columnWriter) direct(cw *pq.ColumnWriter) pq.ColumnBuffer {
	if c.valuePath {
		return nil
	}
	return c.ix.buffer(cw)
}

// runOf returns the message and first index when rows are consecutive
// rows of one message (a piece as the sink cuts them), else nil.
func runOf(rows []schemas.Row) (*schemas.Chunk, int) {
	if len(rows) == 0 {
		return nil, 0
	}
	c, lo := rows[0].Chunk(), rows[0].Index()
	for i, r := range rows {
		if r.Chunk() != c || r.Index() != lo+i {
			return nil, 0
		}
	}
	return c, lo
}

// release drops the references into the batches once per Write, not per
// column: the buffer must not keep a committed message alive.
func (c *columnWriter) release() {
	clear(c.vals[:cap(c.vals)])
	c.one[0] = pq.Value{}
	for i := range c.remaps {
		c.remaps[i].chunk, c.remaps[i].keys = nil, nil
	}
}

func (c *columnWriter) Flush() error                          { return c.w.Flush() }
func (c *columnWriter) Close() error                          { return c.w.Close() }
func (c *columnWriter) SetKeyValueMetadata(key, value string) { c.w.SetKeyValueMetadata(key, value) }
