package report

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/schemas"
)

// Options narrow and shape the report. The zero value reports everything
// per tenant × zone × direction as a table.
type Options struct {
	// By lists the group-by dimensions (names of Dimensions or their
	// columns), in output order. Empty means DefaultBy.
	By []string
	// From and To keep the records whose time_end is in [From, To). A zero
	// bound is open. Partitions (hours of time_end, UTC) outside the range
	// are not opened, row groups whose time_end statistics are outside it
	// are skipped, and the remaining rows are filtered one by one, so the
	// totals are exact.
	From, To time.Time
	// Tenant keeps only records of this tenant_id; Zone only of this zone.
	Tenant, Zone string

	// Format is table (the default), csv or json; used by Run.
	Format string
	// Names, when set, adds the names of projects, servers, ports and load
	// balancers next to their IDs; used by Run.
	Names *Names

	// Dims, when set, replaces By with these dimensions as given (other
	// packages' own time buckets: internal/audit); at most 15.
	Dims []Dimension
}

// Dimension is a flow.v1 column the report can group by.
type Dimension struct {
	Name   string // as given to --by: tenant
	Column string // flow.v1 column and output field: tenant_id
	Int    bool   // an INT32 column (lb_segment); the others are strings
	// NameField is the output field holding the inventory name of the ID
	// (with --names), "" when the inventory names no such object.
	NameField string
	// Bucket, when set, makes this a time dimension: time_end (UTC) cut
	// into buckets of this length (day, hour), shown as Layout (or as the
	// bucket number since the epoch when Layout is empty).
	Bucket time.Duration
	Layout string
	// Time and Offset (time dimensions of Options.Dims only): the
	// timestamp column bucketed (default time_end), shifted by Offset
	// first.
	Time   string
	Offset time.Duration
	// BlankColumn and BlankValue (string dimensions): the dimension reads
	// '' on records whose BlankColumn holds BlankValue. lb reads '' on a
	// member's copy of segment 2 (lb_tap member): those bytes are the
	// member's, already counted at the amphora's tap, so per-LB totals
	// count every byte once and every grouping keeps the same total.
	BlankColumn, BlankValue string
}

// source is the flow.v1 column a dimension reads.
func (d Dimension) source() string {
	if d.Bucket > 0 {
		return cmp.Or(d.Time, "time_end")
	}
	return d.Column
}

// Dimensions are every dimension, in the order --help lists them.
var Dimensions = []Dimension{
	{Name: "tenant", Column: "tenant_id", NameField: "tenant_name"},
	{Name: "zone", Column: "zone"},
	{Name: "direction", Column: "direction"},
	{Name: "external_network", Column: "external_network"},
	{Name: "server", Column: "server_id", NameField: "server_name"},
	{Name: "port", Column: "port_id", NameField: "port_name"},
	{Name: "lb", Column: "lb_id", NameField: "lb_name", BlankColumn: "lb_tap", BlankValue: schemas.LBTapMember},
	{Name: "lb_segment", Column: "lb_segment", Int: true},
	{Name: "lb_tap", Column: "lb_tap"},
	{Name: "pool", Column: "pool_id", NameField: "pool_name"},
	{Name: "member", Column: "member_id", NameField: "member_name"},
	{Name: "node", Column: "node"},
	{Name: "ifname", Column: "ifname"},
	{Name: "day", Column: "day", Bucket: 24 * time.Hour, Layout: "2006-01-02"},
	{Name: "hour", Column: "hour", Bucket: time.Hour, Layout: "2006-01-02T15Z"},
}

// DefaultBy is the grouping of `tapflow report` without --by.
var DefaultBy = []string{"tenant", "zone", "direction"}

// Zones are the flow.v1 zone values (what --zone accepts).
var Zones = []string{"same_tenant", "other_tenant", "shared", "external", "infra", "multicast", "miss"}

// Formats are the output formats of Run.
var Formats = []string{"table", "csv", "json"}

// DimensionNames lists the names --by accepts, comma-separated.
func DimensionNames() string {
	names := make([]string, len(Dimensions))
	for i, d := range Dimensions {
		names[i] = d.Name
	}
	return strings.Join(names, ", ")
}

// LookupDimension finds a dimension by name (tenant) or column (tenant_id).
func LookupDimension(s string) (Dimension, bool) {
	for _, d := range Dimensions {
		if s == d.Name || s == d.Column {
			return d, true
		}
	}
	return Dimension{}, false
}

// ParseBy parses a comma-separated --by list.
func ParseBy(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--by is empty; name one or more of %s", DimensionNames())
	}
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		d, ok := LookupDimension(f)
		if !ok {
			return nil, fmt.Errorf("--by %q: unknown dimension %q; use a comma-separated list of %s", s, f, DimensionNames())
		}
		if seen[d.Column] {
			return nil, fmt.Errorf("--by %q: %s is listed twice; name each dimension once", s, d.Name)
		}
		seen[d.Column] = true
		out = append(out, d.Name)
	}
	return out, nil
}

// ParseTime parses a --from/--to value: RFC 3339 (2026-11-29T10:30:00Z,
// with any offset), or YYYY-MM-DD, YYYY-MM-DDTHH, YYYY-MM-DDTHH:MM or
// YYYY-MM-DDTHH:MM:SS in UTC.
func ParseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	for _, layout := range []string{"2006-01-02", "2006-01-02T15", "2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time; use RFC 3339 (2026-11-29T10:30:00Z) or YYYY-MM-DD[THH[:MM[:SS]]] (UTC)", s)
}

// Validate checks the options and names the fix of the first problem.
func (o *Options) Validate() error {
	by := o.By
	if len(by) == 0 {
		by = DefaultBy
	}
	if len(o.Dims) > maxDims {
		return fmt.Errorf("%d dimensions; at most %d", len(o.Dims), maxDims)
	}
	if _, err := ParseBy(strings.Join(by, ",")); err != nil && len(o.Dims) == 0 {
		return err
	}
	if !o.From.IsZero() && !o.To.IsZero() && !o.From.Before(o.To) {
		return fmt.Errorf("--from %s is not before --to %s; the range is [from, to): from inclusive, to exclusive",
			o.From.Format(time.RFC3339Nano), o.To.Format(time.RFC3339Nano))
	}
	if o.Zone != "" && !slices.Contains(Zones, o.Zone) {
		return fmt.Errorf("--zone %q: no such zone; use one of %s", o.Zone, strings.Join(Zones, ", "))
	}
	if o.Format != "" && !slices.Contains(Formats, o.Format) {
		return fmt.Errorf("--format %q: unknown format; use table, csv or json", o.Format)
	}
	return nil
}

// Row is one group: its dimension values and sums.
type Row struct {
	// Keys are the values of Report.By, in order (lb_segment in decimal).
	Keys                    []string
	Records, Packets, Bytes int64
}

// Totals are the sums of a report.
type Totals struct {
	Records, Packets, Bytes int64
}

// Partition is one hourly directory read.
type Partition struct {
	Name  string // dt=YYYY-MM-DD/hour=HH (relative to flows/)
	Files int
	Rows  int64 // rows in its files (before any filter)
	Bytes int64 // on disk
}

// Report is what Read gathers.
type Report struct {
	By         []Dimension
	From, To   time.Time // the range asked for (zero: open)
	Tenant     string    // filters asked for
	Zone       string
	Rows       []Row // sorted by By (lb_segment numerically)
	Total      Totals
	Files      int
	FileRows   int64 // rows in the files read (before any filter)
	DiskBytes  int64
	Partitions []Partition // sorted by name
	// RowGroups counts the row groups of the files read; SkippedRowGroups
	// those whose time_end statistics fall outside [From, To).
	RowGroups, SkippedRowGroups int
}

// Run reads every committed file under dataDir/flows and prints the report
// in opts.Format.
func Run(w io.Writer, dataDir string, opts Options) error {
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	out, err := dataset.Open(context.Background(), dataDir, dataset.Options{})
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return RunOutput(context.Background(), w, out, opts)
}

// RunOutput reads every committed file under out's flows/ (a directory or
// s3://) and prints the report in opts.Format.
func RunOutput(ctx context.Context, w io.Writer, out *dataset.Output, opts Options) error {
	r, err := ReadOutput(ctx, out, opts)
	if err != nil {
		return err
	}
	switch opts.Format {
	case "", "table":
		return r.Print(w, opts.Names)
	case "csv":
		return r.CSV(w, opts.Names)
	case "json":
		return r.JSON(w, opts.Names)
	}
	return fmt.Errorf("report: --format %q: unknown format; use table, csv or json", opts.Format)
}

// Read reads every committed flow.v1 file under dataDir/flows.
func Read(dataDir string, opts Options) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	out, err := dataset.Open(context.Background(), dataDir, dataset.Options{})
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return ReadOutput(context.Background(), out, opts)
}

// ReadOutput reads every committed flow.v1 file under out's flows/ (a
// directory or s3://).
func ReadOutput(ctx context.Context, out *dataset.Output, opts Options) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	files, err := out.List(ctx, "flows")
	if err != nil {
		return nil, fmt.Errorf("report: %w; point --data at the collector output (the directory or s3://bucket/prefix holding flows/)", err)
	}

	q := newQuery(opts)
	parts := make(map[string]*Partition)
	rep := &Report{By: q.dims, From: opts.From, To: opts.To, Tenant: opts.Tenant, Zone: opts.Zone}
	for _, f := range files {
		rel := f.Partition()
		if !inRange(rel, opts) {
			continue
		}
		rows, size, err := q.readFile(ctx, out, f, rep)
		if err != nil {
			return nil, err
		}
		part := parts[rel]
		if part == nil {
			part = &Partition{Name: rel}
			parts[rel] = part
		}
		part.Files++
		part.Rows += rows
		part.Bytes += size
		rep.Files++
		rep.FileRows += rows
		rep.DiskBytes += size
	}
	rep.Rows = q.rows()
	for _, r := range rep.Rows {
		rep.Total.Records += r.Records
		rep.Total.Packets += r.Packets
		rep.Total.Bytes += r.Bytes
	}
	for _, p := range parts {
		rep.Partitions = append(rep.Partitions, *p)
	}
	slices.SortFunc(rep.Partitions, func(a, b Partition) int { return cmp.Compare(a.Name, b.Name) })
	return rep, nil
}

// inRange reports whether partition dir dt=YYYY-MM-DD/hour=HH overlaps
// [From, To). Directories of another shape are always read.
func inRange(dir string, o Options) bool {
	if o.From.IsZero() && o.To.IsZero() {
		return true
	}
	t, err := time.Parse("dt=2006-01-02/hour=15", dir)
	if err != nil {
		return true
	}
	return (o.From.IsZero() || t.Add(time.Hour).After(o.From)) && (o.To.IsZero() || t.Before(o.To))
}

// maxDims bounds the group-by key: every dimension at most once.
const maxDims = 15

// groupKey holds one value id per dimension (the lb_segment value itself).
type groupKey [maxDims]uint32

type sums struct{ records, packets, bytes int64 }

// column is one flow.v1 column read, with the string values seen so far
// (interned: a value's id is its index in values).
type column struct {
	name   string
	int    bool
	ids    map[string]uint32
	values []string
}

func (c *column) intern(b []byte) uint32 {
	if id, ok := c.ids[string(b)]; ok {
		return id
	}
	s := string(b)
	id := uint32(len(c.values))
	c.ids[s] = id
	c.values = append(c.values, s)
	return id
}

// query is the compiled form of Options: the columns to read and what each
// is for.
type query struct {
	dims     []Dimension
	cols     []*column // every column read; packets and bytes first
	keyCols  []int     // index in cols of each dimension
	blanks   []blank   // dimensions read as '' on some records
	filters  []filter
	timeCol  int // index in cols of time_end, -1 without a range
	from, to int64
	bits     uint // per dimension in a packed key: 64 / dimensions
	packed   map[uint64]int32
	wide     map[groupKey]int32
	sums     []sums
	keys     []groupKey
}

type filter struct {
	col int
	id  uint32
}

// blank makes dimension dim read as the id of ” (empty) on the rows
// whose column col holds id (Dimension.BlankColumn, BlankValue).
type blank struct {
	dim, col  int
	id, empty uint32
}

const (
	colPackets = 0
	colBytes   = 1
)

func newQuery(o Options) *query {
	by := o.By
	if len(by) == 0 {
		by = DefaultBy
	}
	q := &query{timeCol: -1, packed: map[uint64]int32{}, wide: map[groupKey]int32{}, from: minInt64, to: maxInt64}
	add := func(name string, isInt bool) int {
		for i, c := range q.cols {
			if c.name == name {
				return i
			}
		}
		q.cols = append(q.cols, &column{name: name, int: isInt, ids: map[string]uint32{}})
		return len(q.cols) - 1
	}
	add("packets", true)
	add("bytes", true)
	dims := o.Dims
	if len(dims) == 0 {
		for _, name := range by {
			d, _ := LookupDimension(name)
			dims = append(dims, d)
		}
	}
	for _, d := range dims {
		q.dims = append(q.dims, d)
		q.keyCols = append(q.keyCols, add(d.source(), d.Int || d.Bucket > 0))
	}
	for i, d := range q.dims {
		if d.BlankColumn != "" && !d.Int && d.Bucket == 0 {
			c := add(d.BlankColumn, false)
			q.blanks = append(q.blanks, blank{dim: i, col: c, id: q.cols[c].intern([]byte(d.BlankValue)), empty: q.cols[q.keyCols[i]].intern(nil)})
		}
	}
	q.bits = uint(64 / max(1, len(q.dims)))
	for col, v := range map[string]string{"tenant_id": o.Tenant, "zone": o.Zone} {
		if v != "" {
			i := add(col, false)
			q.filters = append(q.filters, filter{col: i, id: q.cols[i].intern([]byte(v))})
		}
	}
	slices.SortFunc(q.filters, func(a, b filter) int { return cmp.Compare(a.col, b.col) })
	if !o.From.IsZero() || !o.To.IsZero() {
		q.timeCol = add("time_end", true)
		if !o.From.IsZero() {
			q.from = ceilMicro(o.From)
		}
		if !o.To.IsZero() {
			q.to = ceilMicro(o.To)
		}
	}
	return q
}

const (
	minInt64 = -1 << 63
	maxInt64 = 1<<63 - 1
)

// ceilMicro is t in µs since the epoch, rounded up: time_end ≥ t (or < t)
// holds for a µs timestamp exactly when it holds for the rounded value.
func ceilMicro(t time.Time) int64 {
	us := t.UnixMicro()
	if time.UnixMicro(us).Before(t) {
		us++
	}
	return us
}

// rows returns the groups as sorted report rows.
func (q *query) rows() []Row {
	out := make([]Row, len(q.sums))
	for i, s := range q.sums {
		keys := make([]string, len(q.dims))
		for d, c := range q.keyCols {
			id := q.keys[i][d]
			if b := q.dims[d].Bucket; b > 0 && q.dims[d].Layout == "" {
				keys[d] = strconv.FormatUint(uint64(id), 10)
			} else if b > 0 {
				keys[d] = time.UnixMicro(int64(id) * b.Microseconds()).UTC().Format(q.dims[d].Layout)
			} else if q.dims[d].Int {
				keys[d] = strconv.FormatInt(int64(int32(id)), 10)
			} else {
				keys[d] = q.cols[c].values[id]
			}
		}
		out[i] = Row{Keys: keys, Records: s.records, Packets: s.packets, Bytes: s.bytes}
	}
	slices.SortFunc(out, func(a, b Row) int {
		for d, dim := range q.dims {
			var c int
			if dim.Int {
				x, _ := strconv.ParseInt(a.Keys[d], 10, 64)
				y, _ := strconv.ParseInt(b.Keys[d], 10, 64)
				c = cmp.Compare(x, y)
			} else {
				c = cmp.Compare(a.Keys[d], b.Keys[d])
			}
			if c != 0 {
				return c
			}
		}
		return 0
	})
	return out
}

// readFile adds the rows of one file to the groups, one row group at a
// time, and returns its row count and size.
func (q *query) readFile(ctx context.Context, out *dataset.Output, file dataset.File, rep *Report) (rows, size int64, err error) {
	f, err := out.Open(ctx, file)
	if err != nil {
		return 0, 0, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	bad := func(err error) error {
		return fmt.Errorf("report: read %s: %w; it is not a complete flow.v1 Parquet file (the collector never leaves partial files): move it out of its partition", out.Where(file), err)
	}
	pf, err := pq.OpenFile(f, f.Size(), pq.SkipBloomFilters(true), pq.SkipPageIndex(true))
	if err != nil {
		return 0, 0, bad(err)
	}
	if v, _ := pf.Lookup(schemas.MetadataKey); v != schemas.SchemaName {
		return 0, 0, bad(fmt.Errorf("key-value metadata %s=%q, want %q", schemas.MetadataKey, v, schemas.SchemaName))
	}
	leaves := make([]int, len(q.cols))
	for i, c := range q.cols {
		leaf, ok := pf.Schema().Lookup(c.name)
		switch {
		case ok:
			leaves[i] = leaf.ColumnIndex
		case addedLater(c.name):
			leaves[i] = -1 // a file of an older minor version: zero values
		default:
			return 0, 0, bad(fmt.Errorf("no column %s", c.name))
		}
	}
	r := rowGroupReader{q: q, leaves: leaves}
	for _, rg := range pf.RowGroups() {
		rep.RowGroups++
		filterTime := q.timeCol >= 0
		if filterTime {
			switch q.timeBounds(rg.ColumnChunks()[leaves[q.timeCol]]) {
			case outside:
				rep.SkippedRowGroups++
				rows += rg.NumRows()
				continue
			case inside:
				filterTime = false
			}
		}
		n, err := r.read(rg, filterTime)
		rows += n
		if err != nil {
			return rows, 0, bad(err)
		}
	}
	if rows != pf.NumRows() {
		return rows, 0, bad(fmt.Errorf("read %d rows, footer says %d", rows, pf.NumRows()))
	}
	return rows, f.Size(), nil
}

type overlap int

const (
	partly overlap = iota
	inside
	outside
)

// timeBounds places a time_end column chunk against [from, to) by its
// statistics; partly when it has none.
func (q *query) timeBounds(c pq.ColumnChunk) overlap {
	b, ok := c.(interface {
		Bounds() (min, max pq.Value, ok bool)
	})
	if !ok {
		return partly
	}
	lo, hi, ok := b.Bounds()
	if !ok || lo.Kind() != pq.Int64 || hi.Kind() != pq.Int64 {
		return partly
	}
	switch mn, mx := lo.Int64(), hi.Int64(); {
	case mx < q.from || mn >= q.to:
		return outside
	case mn >= q.from && mx < q.to:
		return inside
	}
	return partly
}

// batchRows is how many rows are decoded per column before they are
// aggregated.
const batchRows = 4096

// rowGroupReader aggregates row groups reading only the needed column
// chunks, page by page, in lockstep, straight from the decoded page
// buffers (dictionary indexes, int64 arrays) without parquet.Value.
type rowGroupReader struct {
	q       *query
	leaves  []int
	curs    []cursor
	buckets [][]uint32 // per dimension: the bucket ids of a time dimension
	blanked [][]uint32 // per blank: the dimension's ids, some blanked
}

func (r *rowGroupReader) read(rg pq.RowGroup, filterTime bool) (rows int64, err error) {
	q := r.q
	chunks := rg.ColumnChunks()
	if r.curs == nil {
		r.curs = make([]cursor, len(q.cols))
		for i, c := range q.cols {
			r.curs[i].col = c
			if c.int {
				r.curs[i].i64 = make([]int64, batchRows)
			}
			if !c.int || slices.Contains(q.keyCols, i) {
				r.curs[i].ids = make([]uint32, batchRows)
			}
		}
	}
	for i := range r.curs {
		if r.leaves[i] < 0 {
			r.curs[i].reset(nil)
			continue
		}
		r.curs[i].reset(chunks[r.leaves[i]].Pages())
	}
	defer func() {
		for i := range r.curs {
			r.curs[i].close()
		}
	}()
	keySrc := make([][]uint32, len(q.keyCols))
	for rows < rg.NumRows() {
		want := int(min(batchRows, rg.NumRows()-rows))
		for i := range r.curs {
			c := &r.curs[i]
			if r.leaves[i] < 0 {
				c.fillZero(want)
				continue
			}
			if err := c.fill(want); err != nil {
				return rows, fmt.Errorf("column %s at row %d: %w", c.col.name, rows, err)
			}
		}
		for d, c := range q.keyCols {
			if b := q.dims[d].Bucket.Microseconds(); b > 0 {
				if r.buckets == nil {
					r.buckets = make([][]uint32, len(q.dims))
				}
				if r.buckets[d] == nil {
					r.buckets[d] = make([]uint32, batchRows)
				}
				off := q.dims[d].Offset.Microseconds()
				for j, us := range r.curs[c].i64[:want] {
					r.buckets[d][j] = uint32(max(0, (us+off)/b)) // hours since 1970 fit until the year 491 000
				}
				keySrc[d] = r.buckets[d][:want]
				continue
			}
			keySrc[d] = r.curs[c].ids[:want]
		}
		for i, b := range q.blanks {
			if r.blanked == nil {
				r.blanked = make([][]uint32, len(q.blanks))
			}
			if r.blanked[i] == nil {
				r.blanked[i] = make([]uint32, batchRows)
			}
			dst, when := r.blanked[i][:want], r.curs[b.col].ids[:want]
			copy(dst, keySrc[b.dim])
			for j, id := range when {
				if id == b.id {
					dst[j] = b.empty
				}
			}
			keySrc[b.dim] = dst
		}
		packets, bytes := r.curs[colPackets].i64[:want], r.curs[colBytes].i64[:want]
		var times []int64
		if filterTime {
			times = r.curs[q.timeCol].i64[:want]
		}
	rowLoop:
		for j := range want {
			if times != nil && (times[j] < q.from || times[j] >= q.to) {
				continue
			}
			for _, f := range q.filters {
				if r.curs[f.col].ids[j] != f.id {
					continue rowLoop
				}
			}
			// Small ids pack into one uint64 (a fast map); the others use
			// the whole key. The choice depends on the key only, so a group
			// is always in the same map.
			var packed uint64
			var over uint32
			for _, src := range keySrc {
				id := src[j]
				packed = packed<<q.bits | uint64(id)
				over |= id >> q.bits
			}
			var g int32
			var ok bool
			if over == 0 {
				g, ok = q.packed[packed]
			} else {
				var k groupKey
				for d, src := range keySrc {
					k[d] = src[j]
				}
				g, ok = q.wide[k]
			}
			if !ok {
				var k groupKey
				for d, src := range keySrc {
					k[d] = src[j]
				}
				g = int32(len(q.sums))
				if over == 0 {
					q.packed[packed] = g
				} else {
					q.wide[k] = g
				}
				q.sums = append(q.sums, sums{})
				q.keys = append(q.keys, k)
			}
			s := &q.sums[g]
			s.records++
			s.packets += packets[j]
			s.bytes += bytes[j]
		}
		rows += int64(want)
	}
	return rows, nil
}

// cursor decodes one column chunk page by page into ids (strings, and
// INT32 dimensions) or i64 (integers).
type cursor struct {
	col   *column
	pages pq.Pages
	page  pq.Page
	pos   int // next value of page
	n     int // values in page

	// the current page's data, one of:
	idx    []int32 // dictionary indexes
	data   []byte  // plain byte arrays
	offs   []uint32
	ints   []int64
	ints32 []int32

	dict    pq.Dictionary
	dictIDs []uint32 // dictionary index → id+1 (0: not looked up yet)

	ids []uint32
	i64 []int64
}

// addedLater reports whether flow.v1 column name came in a later minor
// version (older files lack it; it reads as its zero value).
func addedLater(name string) bool {
	for _, c := range schemas.FlowTable.Columns() {
		if c.Name == name {
			return c.Since > 0
		}
	}
	return false
}

// fillZero stands in for a column the file does not have: n zero values
// ("" for strings).
func (c *cursor) fillZero(n int) {
	if c.i64 != nil {
		clear(c.i64[:n])
	}
	if c.ids != nil {
		id := uint32(0)
		if !c.col.int {
			id = c.col.intern(nil)
		}
		for j := range c.ids[:n] {
			c.ids[j] = id
		}
	}
}

func (c *cursor) reset(pages pq.Pages) {
	c.pages, c.page, c.pos, c.n = pages, nil, 0, 0
	c.dict, c.dictIDs = nil, c.dictIDs[:0]
}

func (c *cursor) close() {
	if c.page != nil {
		pq.Release(c.page)
		c.page = nil
	}
	if c.pages != nil {
		_ = c.pages.Close()
		c.pages = nil
	}
}

// nextPage releases the page read and decodes the next one.
func (c *cursor) nextPage() error {
	if c.page != nil {
		pq.Release(c.page)
		c.page = nil
	}
	p, err := c.pages.ReadPage()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("column chunk ends before the row group")
		}
		return err
	}
	c.page, c.pos, c.n = p, 0, int(p.NumValues())
	c.idx, c.data, c.offs, c.ints, c.ints32 = nil, nil, nil, nil, nil
	if p.NumNulls() != 0 {
		return fmt.Errorf("%d nulls in a required column", p.NumNulls())
	}
	if d := p.Dictionary(); d != nil {
		if d != c.dict {
			c.dict = d
			c.dictIDs = slices.Grow(c.dictIDs[:0], d.Len())[:d.Len()]
			clear(c.dictIDs)
		}
		v := p.Data()
		c.idx = v.Int32()
		if len(c.idx) < c.n {
			return fmt.Errorf("%d dictionary indexes for %d values", len(c.idx), c.n)
		}
		return nil
	}
	v := p.Data()
	switch k := p.Type().Kind(); {
	case k == pq.ByteArray && !c.col.int:
		c.data, c.offs = v.ByteArray()
		if len(c.offs) < c.n+1 {
			return fmt.Errorf("%d offsets for %d values", len(c.offs), c.n)
		}
	case k == pq.Int64 && c.col.int:
		c.ints = v.Int64()
		if len(c.ints) < c.n {
			return fmt.Errorf("%d values, page says %d", len(c.ints), c.n)
		}
	case k == pq.Int32 && c.col.int:
		c.ints32 = v.Int32()
		if len(c.ints32) < c.n {
			return fmt.Errorf("%d values, page says %d", len(c.ints32), c.n)
		}
	default:
		return fmt.Errorf("unexpected physical type %s", k)
	}
	return nil
}

// fill decodes the next want values into ids or i64.
func (c *cursor) fill(want int) error {
	for n := 0; n < want; {
		if c.page == nil || c.pos == c.n {
			if err := c.nextPage(); err != nil {
				return fmt.Errorf("%d of %d values: %w", n, want, err)
			}
			continue
		}
		m := min(want-n, c.n-c.pos)
		switch {
		case c.idx != nil:
			if err := c.fillDict(n, m); err != nil {
				return err
			}
		case c.offs != nil:
			for k := range m {
				i := c.pos + k
				lo, hi := c.offs[i], c.offs[i+1]
				if lo > hi || int(hi) > len(c.data) {
					return fmt.Errorf("byte array offsets %d..%d outside the page", lo, hi)
				}
				c.ids[n+k] = c.col.intern(c.data[lo:hi])
			}
		case c.ints != nil:
			copy(c.i64[n:n+m], c.ints[c.pos:c.pos+m])
		case c.ints32 != nil:
			for k, v := range c.ints32[c.pos : c.pos+m] {
				c.i64[n+k] = int64(v)
			}
		}
		if c.col.int && c.ids != nil { // an INT32 dimension: its value is its id
			for k, v := range c.i64[n : n+m] {
				c.ids[n+k] = uint32(int32(v))
			}
		}
		c.pos += m
		n += m
	}
	return nil
}

// fillDict decodes m dictionary-encoded values into position n on.
func (c *cursor) fillDict(n, m int) error {
	for k, ix := range c.idx[c.pos : c.pos+m] {
		if uint(ix) >= uint(len(c.dictIDs)) {
			return fmt.Errorf("dictionary index %d of %d entries", ix, len(c.dictIDs))
		}
		if c.col.int {
			v := c.dict.Index(ix)
			if v.Kind() == pq.Int32 {
				c.i64[n+k] = int64(v.Int32())
			} else {
				c.i64[n+k] = v.Int64()
			}
			continue
		}
		id := c.dictIDs[ix]
		if id == 0 {
			id = c.col.intern(c.dict.Index(ix).ByteArray()) + 1
			c.dictIDs[ix] = id
		}
		c.ids[n+k] = id - 1
	}
	return nil
}
