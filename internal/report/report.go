package report

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
)

// Options narrow the report. The zero value reports everything.
type Options struct {
	// From and To keep the partitions (hours of time_end, UTC) that
	// overlap [From, To): whole hours, as files are not split. A zero
	// bound is open.
	From, To time.Time
	// Tenant keeps only records of this tenant_id.
	Tenant string
}

// Row is one line of the table.
type Row struct {
	Tenant, Zone, Direction string
	Records, Packets, Bytes int64
}

// Partition is one hourly directory read.
type Partition struct {
	Name  string // dt=YYYY-MM-DD/hour=HH (relative to flows/)
	Files int
	Rows  int64 // rows in its files (before the tenant filter)
	Bytes int64 // on disk
}

// Report is what Read gathers.
type Report struct {
	Rows       []Row // sorted by tenant, zone, direction
	Total      Row
	Files      int
	FileRows   int64 // rows in the files read (before the tenant filter)
	DiskBytes  int64
	Partitions []Partition // sorted by name
}

// columns are the flow.v1 columns the table needs, in this order.
var columns = [...]string{"tenant_id", "zone", "direction", "packets", "bytes"}

type key struct{ tenant, zone, dir string }

// Run reads every committed file under dataDir/flows and prints the table.
func Run(w io.Writer, dataDir string, opts Options) error {
	r, err := Read(dataDir, opts)
	if err != nil {
		return err
	}
	return r.Print(w)
}

// Read reads every committed flow.v1 file under dataDir/flows.
func Read(dataDir string, opts Options) (*Report, error) {
	root := filepath.Join(dataDir, "flows")
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("report: %s: %w; point --data at the collector output (the directory holding flows/)", root, err)
	}
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".parquet") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("report: list %s: %w", root, err)
	}
	slices.Sort(files)

	agg := make(map[key]*Row)
	parts := make(map[string]*Partition)
	rep := &Report{}
	intern := make(map[string]string)
	for _, p := range files {
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		rel = filepath.ToSlash(rel)
		if !inRange(rel, opts) {
			continue
		}
		rows, size, err := readFile(p, opts.Tenant, agg, intern)
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
	for _, r := range agg {
		rep.Rows = append(rep.Rows, *r)
		rep.Total.Records += r.Records
		rep.Total.Packets += r.Packets
		rep.Total.Bytes += r.Bytes
	}
	slices.SortFunc(rep.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.Direction, b.Direction))
	})
	for _, p := range parts {
		rep.Partitions = append(rep.Partitions, *p)
	}
	slices.SortFunc(rep.Partitions, func(a, b Partition) int { return cmp.Compare(a.Name, b.Name) })
	return rep, nil
}

// inRange reports whether partition dir dt=YYYY-MM-DD/hour=HH is in
// [From, To). Directories of another shape are always read.
func inRange(dir string, o Options) bool {
	if o.From.IsZero() && o.To.IsZero() {
		return true
	}
	t, err := time.Parse("dt=2006-01-02/hour=15", dir)
	if err != nil {
		return true
	}
	return (o.From.IsZero() || !t.Before(o.From.Truncate(time.Hour))) && (o.To.IsZero() || t.Before(o.To))
}

// readFile adds the rows of one file to agg, one row group at a time, and
// returns its row count and size.
func readFile(p, tenant string, agg map[key]*Row, in map[string]string) (rows, size int64, err error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, 0, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, fmt.Errorf("report: %w", err)
	}
	bad := func(err error) error {
		return fmt.Errorf("report: read %s: %w; it is not a complete flow.v1 Parquet file (the collector never leaves partial files): move it out of %s", p, err, filepath.Dir(p))
	}
	pf, err := pq.OpenFile(f, st.Size(), pq.SkipBloomFilters(true), pq.SkipPageIndex(true))
	if err != nil {
		return 0, 0, bad(err)
	}
	if v, _ := pf.Lookup(schemas.MetadataKey); v != schemas.SchemaName {
		return 0, 0, bad(fmt.Errorf("key-value metadata %s=%q, want %q", schemas.MetadataKey, v, schemas.SchemaName))
	}
	var idx [len(columns)]int
	for i, name := range columns {
		leaf, ok := pf.Schema().Lookup(name)
		if !ok {
			return 0, 0, bad(fmt.Errorf("no column %s", name))
		}
		idx[i] = leaf.ColumnIndex
	}
	r := rowGroupReader{tenant: tenant, agg: agg, intern: in}
	for _, rg := range pf.RowGroups() {
		n, err := r.read(rg, idx)
		rows += n
		if err != nil {
			return rows, 0, bad(err)
		}
	}
	if rows != pf.NumRows() {
		return rows, 0, bad(fmt.Errorf("read %d rows, footer says %d", rows, pf.NumRows()))
	}
	return rows, st.Size(), nil
}

// rowGroupReader aggregates row groups reading only the needed column
// chunks, page by page, in lockstep.
type rowGroupReader struct {
	tenant string
	agg    map[key]*Row
	intern map[string]string
	cols   [len(columns)]columnValues
	bufs   [len(columns)][]pq.Value
}

func (r *rowGroupReader) read(rg pq.RowGroup, idx [len(columns)]int) (rows int64, err error) {
	chunks := rg.ColumnChunks()
	for i := range r.cols {
		r.cols[i] = columnValues{pages: chunks[idx[i]].Pages(), done: r.cols[i].done[:0]}
		if r.bufs[i] == nil {
			r.bufs[i] = make([]pq.Value, 1024)
		}
	}
	defer func() {
		for i := range r.cols {
			r.cols[i].close()
		}
	}()
	for rows < rg.NumRows() {
		want := int(min(int64(len(r.bufs[0])), rg.NumRows()-rows))
		for i := range r.cols {
			n, err := r.cols[i].read(r.bufs[i][:want])
			if err != nil && !(errors.Is(err, io.EOF) && n == want) {
				return rows, fmt.Errorf("column %s: %d of %d values at row %d: %w", columns[i], n, want, rows, err)
			}
		}
		tenants, zones, dirs, packets, bytes := r.bufs[0][:want], r.bufs[1][:want], r.bufs[2][:want], r.bufs[3][:want], r.bufs[4][:want]
		for j := range want {
			t := r.str(tenants[j].ByteArray())
			if r.tenant != "" && t != r.tenant {
				continue
			}
			k := key{t, r.str(zones[j].ByteArray()), r.str(dirs[j].ByteArray())}
			row := r.agg[k]
			if row == nil {
				row = &Row{Tenant: k.tenant, Zone: k.zone, Direction: k.dir}
				r.agg[k] = row
			}
			row.Records++
			row.Packets += packets[j].Int64()
			row.Bytes += bytes[j].Int64()
		}
		for i := range r.cols {
			r.cols[i].release()
		}
		rows += int64(want)
	}
	return rows, nil
}

// str returns the interned string of b without allocating once seen.
func (r *rowGroupReader) str(b []byte) string {
	if s, ok := r.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	r.intern[s] = s
	return s
}

// columnValues reads the values of one column chunk across its pages.
// Byte-array values point into their page, so pages read to the end are
// only released (returned to parquet-go's buffer pool) by release, once
// the values have been used.
type columnValues struct {
	pages pq.Pages
	page  pq.Page
	vals  pq.ValueReader
	done  []pq.Page
}

// read fills buf unless the chunk ends (io.EOF).
func (c *columnValues) read(buf []pq.Value) (int, error) {
	n := 0
	for n < len(buf) {
		if c.vals == nil {
			p, err := c.pages.ReadPage()
			if err != nil {
				return n, err
			}
			c.page, c.vals = p, p.Values()
		}
		m, err := c.vals.ReadValues(buf[n:])
		n += m
		if errors.Is(err, io.EOF) {
			c.done = append(c.done, c.page)
			c.page, c.vals = nil, nil
			continue
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// release returns the pages read to the end to the pool.
func (c *columnValues) release() {
	for _, p := range c.done {
		pq.Release(p)
	}
	c.done = c.done[:0]
}

func (c *columnValues) close() {
	c.release()
	if c.page != nil {
		pq.Release(c.page)
		c.page, c.vals = nil, nil
	}
	if c.pages != nil {
		_ = c.pages.Close()
	}
}

// Print writes the table, the totals and the partition list.
func (r *Report) Print(w io.Writer) error {
	ew := &errWriter{w: w}
	if r.Files == 0 {
		fmt.Fprintln(ew, "no committed Parquet files")
		return ew.err
	}
	header := []string{"tenant_id", "zone", "direction", "records", "packets", "bytes"}
	cells := [][]string{header}
	for _, row := range r.Rows {
		cells = append(cells, []string{row.Tenant, row.Zone, row.Direction, itoa(row.Records), itoa(row.Packets), itoa(row.Bytes)})
	}
	total := []string{"TOTAL", "", "", itoa(r.Total.Records), itoa(r.Total.Packets), itoa(r.Total.Bytes)}
	widths := make([]int, len(header))
	for _, c := range append(cells, total) {
		for i, s := range c {
			widths[i] = max(widths[i], len(s))
		}
	}
	line := func(c []string) {
		var b strings.Builder
		for i, s := range c {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-len(s))
			if i >= 3 { // numbers align right
				b.WriteString(pad + s)
			} else {
				b.WriteString(s + pad)
			}
		}
		fmt.Fprintln(ew, strings.TrimRight(b.String(), " "))
	}
	rule := func() {
		parts := make([]string, len(widths))
		for i, n := range widths {
			parts[i] = strings.Repeat("-", n)
		}
		fmt.Fprintln(ew, strings.Join(parts, "  "))
	}
	line(header)
	rule()
	for _, c := range cells[1:] {
		line(c)
	}
	rule()
	line(total)
	fmt.Fprintln(ew)
	perRow := 0.0
	if r.FileRows > 0 {
		perRow = float64(r.DiskBytes) / float64(r.FileRows)
	}
	fmt.Fprintf(ew, "files: %d  rows: %d  bytes on disk: %d (%s, %.1f B/row)\n", r.Files, r.FileRows, r.DiskBytes, human(r.DiskBytes), perRow)
	fmt.Fprintf(ew, "partitions (%d):\n", len(r.Partitions))
	nameW, filesW, rowsW := 0, 0, 0
	for _, p := range r.Partitions {
		nameW = max(nameW, len(p.Name))
		filesW = max(filesW, len(strconv.Itoa(p.Files)))
		rowsW = max(rowsW, len(itoa(p.Rows)))
	}
	for _, p := range r.Partitions {
		fmt.Fprintf(ew, "  %-*s  %*d %-5s  %*s rows  %s\n", nameW, p.Name, filesW, p.Files, plural(p.Files, "file"), rowsW, itoa(p.Rows), human(p.Bytes))
	}
	return ew.err
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func human(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = fmt.Errorf("report: write: %w", err)
	}
	return n, err
}
