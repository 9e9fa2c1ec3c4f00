package parquet

import (
	"fmt"
	"io"

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
	w, _ := any(newColumnWriter(out, s.schema.rows, s.wopts)).(fileWriter[T])
	return w
}

// columnWriter writes rows column by column through the Parquet writer's
// column writers (the schema of the table's record struct, so the files
// are the same as GenericWriter's). Values are built in a recycled
// buffer of columnStep rows; byte arrays point into the Arrow buffers
// (the column writers copy them into their pages and dictionaries).
type columnWriter struct {
	w     *pq.GenericWriter[any]
	colOf []int // Parquet leaf column → table column
	kinds []columns.Kind
	vals  []pq.Value
}

// Dictionary-encoded string columns (the agents' wire form) are read
// through the chunk's indices (Row.Bytes), one slice per row, the same
// cost as plain utf8. Resolving each dictionary entry once to a Parquet
// value cost more than it saved (profiled: 10 % of the collector's CPU
// resolving and 9 % clearing, because the sink writes a chunk in several
// pieces, one per partition, each resolving every entry), and the hash
// per value stays: parquet-go has no exported way to write
// dictionary indices (ColumnWriter.WriteRowValues → Dictionary.Insert, a
// map lookup per value).

const columnStep = 4096

func newColumnWriter(out io.Writer, t *schemas.Table[schemas.Row], wopts []pq.WriterOption) *columnWriter {
	sch := t.ParquetSchema()
	w := pq.NewGenericWriter[any](out, append([]pq.WriterOption{sch}, wopts...)...)
	cw := &columnWriter{w: w, vals: make([]pq.Value, 0, columnStep)}
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
	return cw
}

// Write writes whole rows: every column gets the same rows, so a row
// group holds complete rows whenever the sink flushes it.
func (c *columnWriter) Write(rows []schemas.Row) (int, error) {
	cws := c.w.ColumnWriters()
	for start := 0; start < len(rows); start += columnStep {
		part := rows[start:min(start+columnStep, len(rows))]
		for p, cw := range cws {
			k := c.colOf[p]
			v := c.vals[:0]
			switch c.kinds[p] {
			case columns.Timestamp, columns.Int64:
				for _, r := range part {
					v = append(v, pq.Int64Value(r.Int64(k)))
				}
			case columns.Int32:
				for _, r := range part {
					v = append(v, pq.Int32Value(r.Int32(k)))
				}
			default:
				for _, r := range part {
					v = append(v, pq.ByteArrayValue(r.Bytes(k)))
				}
			}
			if _, err := cw.WriteRowValues(v); err != nil {
				c.release()
				return start, fmt.Errorf("column %d: %w", p, err)
			}
		}
	}
	c.release()
	return len(rows), nil
}

// release drops the references into the batches once per Write, not per
// column: the buffer must not keep a committed message alive.
func (c *columnWriter) release() { clear(c.vals[:cap(c.vals)]) }

func (c *columnWriter) Flush() error                          { return c.w.Flush() }
func (c *columnWriter) Close() error                          { return c.w.Close() }
func (c *columnWriter) SetKeyValueMetadata(key, value string) { c.w.SetKeyValueMetadata(key, value) }
