package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tapflow/tapflow/inventory"
)

// Names maps IDs to the names the inventory gives them, per output field
// (tenant_name: project names by project ID, server_name, port_name,
// lb_name).
type Names struct {
	byField map[string]map[string]string
}

// LoadNames reads an inventory file (docs/inventory.md) for its names.
func LoadNames(path string) (*Names, error) {
	inv, err := inventory.Load(path)
	if err != nil {
		return nil, err
	}
	return NamesOf(inv), nil
}

// NamesOf collects the names of projects, servers, ports and load
// balancers of an inventory.
func NamesOf(inv *inventory.Inventory) *Names {
	n := &Names{byField: map[string]map[string]string{
		"tenant_name": {}, "server_name": {}, "port_name": {}, "lb_name": {}, "pool_name": {}, "member_name": {},
	}}
	for _, p := range inv.Pools {
		n.byField["pool_name"][p.ID] = p.Name
		for _, m := range p.Members {
			n.byField["member_name"][m.ID] = m.Name
		}
	}
	for _, p := range inv.Projects {
		n.byField["tenant_name"][p.ID] = p.Name
	}
	for _, s := range inv.Servers {
		n.byField["server_name"][s.ID] = s.Name
	}
	for _, p := range inv.Ports {
		n.byField["port_name"][p.ID] = p.Name
	}
	for _, lb := range inv.LoadBalancers {
		n.byField["lb_name"][lb.ID] = lb.Name
	}
	return n
}

// name is the name of id in field, "" when unknown.
func (n *Names) name(field, id string) string {
	if n == nil {
		return ""
	}
	return n.byField[field][id]
}

// field is one output column: a dimension value or, with names, the name
// next to it.
type field struct {
	header string
	dim    int    // index in Row.Keys
	names  string // NameField when this is the name column of dim
	num    bool   // lb_segment: a number in JSON, right-aligned
}

func (r *Report) fields(names *Names) []field {
	var fs []field
	for i, d := range r.By {
		fs = append(fs, field{header: d.Column, dim: i, num: d.Int})
		if names != nil && d.NameField != "" {
			fs = append(fs, field{header: d.NameField, dim: i, names: d.NameField})
		}
	}
	return fs
}

func (f field) value(row Row, names *Names) string {
	if f.names != "" {
		return names.name(f.names, row.Keys[f.dim])
	}
	return row.Keys[f.dim]
}

// Print writes the table: one line per group with human sizes next to
// the exact bytes, the totals, then what was read.
func (r *Report) Print(w io.Writer, names *Names) error {
	ew := &errWriter{w: w}
	if r.Files == 0 {
		if r.From.IsZero() && r.To.IsZero() {
			fmt.Fprintln(ew, "no committed Parquet files")
		} else {
			fmt.Fprintf(ew, "no committed Parquet files with time_end in %s\n", r.rangeText())
		}
		return ew.err
	}
	fs := r.fields(names)
	header := make([]string, 0, len(fs)+4)
	right := make([]bool, 0, len(fs)+4)
	for _, f := range fs {
		header = append(header, f.header)
		right = append(right, f.num)
	}
	header = append(header, "records", "packets", "bytes", "size")
	right = append(right, true, true, true, true)
	cells := [][]string{header}
	for _, row := range r.Rows {
		c := make([]string, 0, len(header))
		for _, f := range fs {
			v := f.value(row, names)
			if v == "" {
				v = "-"
			}
			c = append(c, v)
		}
		cells = append(cells, append(c, itoa(row.Records), itoa(row.Packets), itoa(row.Bytes), human(row.Bytes)))
	}
	total := make([]string, len(header))
	total[0] = "TOTAL"
	copy(total[len(fs):], []string{itoa(r.Total.Records), itoa(r.Total.Packets), itoa(r.Total.Bytes), human(r.Total.Bytes)})
	if len(fs) > 0 && right[0] { // keep TOTAL left-aligned
		right[0] = false
	}
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
			if right[i] {
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
	if !r.From.IsZero() || !r.To.IsZero() {
		fmt.Fprintf(ew, "time_end in %s\n", r.rangeText())
	}
	if r.Tenant != "" || r.Zone != "" {
		var where []string
		if r.Tenant != "" {
			where = append(where, "tenant_id = "+r.Tenant)
		}
		if r.Zone != "" {
			where = append(where, "zone = "+r.Zone)
		}
		fmt.Fprintf(ew, "only %s\n", strings.Join(where, ", "))
	}
	perRow := 0.0
	if r.FileRows > 0 {
		perRow = float64(r.DiskBytes) / float64(r.FileRows)
	}
	fmt.Fprintf(ew, "files: %d  rows: %d  bytes on disk: %d (%s, %.1f B/row)\n", r.Files, r.FileRows, r.DiskBytes, human(r.DiskBytes), perRow)
	if r.SkippedRowGroups > 0 {
		fmt.Fprintf(ew, "row groups: %d, %d skipped by their time_end statistics\n", r.RowGroups, r.SkippedRowGroups)
	}
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

func (r *Report) rangeText() string {
	from, to := "-∞", "+∞"
	if !r.From.IsZero() {
		from = r.From.UTC().Format(time.RFC3339Nano)
	}
	if !r.To.IsZero() {
		to = r.To.UTC().Format(time.RFC3339Nano)
	}
	return "[" + from + ", " + to + ")"
}

// CSV writes a header and one line per group, exact integers only: the
// dimension columns (with names, each name column after its ID), records,
// packets, bytes. There is no totals line.
func (r *Report) CSV(w io.Writer, names *Names) error {
	cw := csv.NewWriter(w)
	fs := r.fields(names)
	rec := make([]string, 0, len(fs)+3)
	for _, f := range fs {
		rec = append(rec, f.header)
	}
	if err := cw.Write(append(rec, "records", "packets", "bytes")); err != nil {
		return fmt.Errorf("report: write: %w", err)
	}
	for _, row := range r.Rows {
		rec = rec[:0]
		for _, f := range fs {
			rec = append(rec, f.value(row, names))
		}
		if err := cw.Write(append(rec, itoa(row.Records), itoa(row.Packets), itoa(row.Bytes))); err != nil {
			return fmt.Errorf("report: write: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("report: write: %w", err)
	}
	return nil
}

// JSON writes one object (docs/queries.md, "tapflow report"):
//
//	{"by": ["tenant_id", ...], "from": RFC 3339 or null, "to": ...,
//	 "filter": {"tenant_id": "" or the --tenant value, "zone": ""},
//	 "rows": [{"tenant_id": "...", ..., "records": 1, "packets": 2, "bytes": 3}, ...],
//	 "total": {"records": ..., "packets": ..., "bytes": ...},
//	 "files": 4, "file_rows": 30000, "disk_bytes": 123456}
//
// Row keys are the output columns of By (lb_segment is a number; with
// names, tenant_name etc. follow their IDs), then records, packets, bytes.
func (r *Report) JSON(w io.Writer, names *Names) error {
	var b strings.Builder
	str := func(s string) {
		j, _ := json.Marshal(s)
		b.Write(j)
	}
	tm := func(t time.Time) {
		if t.IsZero() {
			b.WriteString("null")
		} else {
			str(t.UTC().Format(time.RFC3339Nano))
		}
	}
	fs := r.fields(names)
	b.WriteString(`{"by":[`)
	for i, d := range r.By {
		if i > 0 {
			b.WriteByte(',')
		}
		str(d.Column)
	}
	b.WriteString(`],"from":`)
	tm(r.From)
	b.WriteString(`,"to":`)
	tm(r.To)
	b.WriteString(`,"filter":{"tenant_id":`)
	str(r.Tenant)
	b.WriteString(`,"zone":`)
	str(r.Zone)
	b.WriteByte('}')
	b.WriteString(`,"rows":[`)
	for i, row := range r.Rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n{")
		for _, f := range fs {
			str(f.header)
			b.WriteByte(':')
			if v := f.value(row, names); f.num {
				b.WriteString(v)
			} else {
				str(v)
			}
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"records":%d,"packets":%d,"bytes":%d}`, row.Records, row.Packets, row.Bytes)
	}
	fmt.Fprintf(&b, "],\n"+`"total":{"records":%d,"packets":%d,"bytes":%d},"files":%d,"file_rows":%d,"disk_bytes":%d}`+"\n",
		r.Total.Records, r.Total.Packets, r.Total.Bytes, r.Files, r.FileRows, r.DiskBytes)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("report: write: %w", err)
	}
	return nil
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
