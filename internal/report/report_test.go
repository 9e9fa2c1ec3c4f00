package report

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/testkit/committest"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// writeWithSink commits recs through the real Parquet sink under a new
// data directory, in batches of 1000, and returns the directory.
func writeWithSink(t *testing.T, recs []schemas.Flow, rollSize int64) string {
	return writeData(t, recs, rollSize)
}

func writeWithSinkB(b *testing.B, recs []schemas.Flow) string { return writeData(b, recs, 0) }

func writeData(t testing.TB, recs []schemas.Flow, rollSize int64) string {
	t.Helper()
	dir := t.TempDir()
	cfg := parquet.DefaultConfig()
	cfg.Output = dir
	if rollSize > 0 {
		cfg.RowGroupRows = 2048
		cfg.RollSize = 1 << 16
	}
	committest.Flows(t, recs, cfg, parquet.Options{Node: "test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return dir
}

func hourStart(us int64) time.Time { return time.UnixMicro(us).UTC().Truncate(time.Hour) }

// dimValue is the value of a dimension of f, computed from the Go struct
// (not from the Parquet columns) so the report is checked independently.
func dimValue(f *schemas.Flow, dim string) string {
	switch dim {
	case "tenant":
		return f.TenantID
	case "zone":
		return f.Zone
	case "direction":
		return f.Direction
	case "external_network":
		return f.ExternalNetwork
	case "server":
		return f.ServerID
	case "port":
		return f.PortID
	case "lb": // a member's copy of segment 2 is the member's, not the LB's
		if f.LBTap == schemas.LBTapMember {
			return ""
		}
		return f.LBID
	case "lb_tap":
		return f.LBTap
	case "lb_segment":
		return strconv.Itoa(int(f.LBSegment))
	case "pool":
		return f.PoolID
	case "member":
		return f.MemberID
	case "node":
		return f.Node
	case "ifname":
		return f.Ifname
	case "day":
		return time.UnixMicro(f.TimeEnd).UTC().Format("2006-01-02")
	case "hour":
		return time.UnixMicro(f.TimeEnd).UTC().Format("2006-01-02T15Z")
	}
	panic("no dimension " + dim)
}

// expect computes the report rows straight from the records, keyed by the
// dimension values joined with \x00.
func expect(recs []schemas.Flow, by []string, keep func(*schemas.Flow) bool) (map[string]Row, Totals) {
	m := map[string]Row{}
	var total Totals
	for i := range recs {
		f := &recs[i]
		if !keep(f) {
			continue
		}
		keys := make([]string, len(by))
		for d, dim := range by {
			keys[d] = dimValue(f, dim)
		}
		k := strings.Join(keys, "\x00")
		r := m[k]
		r.Keys = keys
		r.Records++
		r.Packets += f.Packets
		r.Bytes += f.Bytes
		m[k] = r
		total.Records++
		total.Packets += f.Packets
		total.Bytes += f.Bytes
	}
	return m, total
}

// byKey indexes report rows like expect.
func byKey(rows []Row) map[string]Row {
	m := map[string]Row{}
	for _, r := range rows {
		m[strings.Join(r.Keys, "\x00")] = r
	}
	return m
}

func all(*schemas.Flow) bool { return true }

func TestRead(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 40, 0, 0, time.UTC)
	recs := parquettest.Flows(parquettest.Spec{Records: 30000, Start: start, Span: 150 * time.Minute}) // hours 10..13
	dir := writeWithSink(t, recs, 1<<16)
	tenant := recs[17].TenantID
	allParts := []string{"dt=2026-11-29/hour=10", "dt=2026-11-29/hour=11", "dt=2026-11-29/hour=12", "dt=2026-11-29/hour=13"}
	from, to := start.Add(50*time.Minute), start.Add(140*time.Minute).Truncate(time.Hour) // 11:30, 13:00
	for _, tc := range []struct {
		name       string
		opts       Options
		keep       func(*schemas.Flow) bool
		partitions []string
	}{
		{name: "everything", keep: all, partitions: allParts},
		{
			name: "from 11:30 to 13:00",
			opts: Options{From: from, To: to},
			keep: func(f *schemas.Flow) bool {
				return f.TimeEnd >= from.UnixMicro() && f.TimeEnd < to.UnixMicro()
			},
			partitions: []string{"dt=2026-11-29/hour=11", "dt=2026-11-29/hour=12"},
		},
		{
			name: "one tenant", opts: Options{Tenant: tenant},
			keep:       func(f *schemas.Flow) bool { return f.TenantID == tenant },
			partitions: allParts,
		},
		{
			name: "one zone by server and lb_segment", opts: Options{Zone: "external", By: []string{"lb_segment", "server"}},
			keep:       func(f *schemas.Flow) bool { return f.Zone == "external" },
			partitions: allParts,
		},
		{
			name: "tenant and zone from 10:59:59.5", opts: Options{Tenant: tenant, Zone: "same_tenant", From: time.Date(2026, 11, 29, 10, 59, 59, 5e8, time.UTC)},
			keep: func(f *schemas.Flow) bool {
				return f.TenantID == tenant && f.Zone == "same_tenant" && f.TimeEnd >= time.Date(2026, 11, 29, 10, 59, 59, 5e8, time.UTC).UnixMicro()
			},
			partitions: allParts,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Read(dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			by := tc.opts.By
			if by == nil {
				by = DefaultBy
			}
			want, total := expect(recs, by, tc.keep)
			if total.Records == 0 || total.Records == int64(len(recs)) && tc.name != "everything" {
				t.Fatalf("test data: the case keeps %d of %d records", total.Records, len(recs))
			}
			checkRows(t, rep, by, want, total)
			var names []string
			var files int
			var rows, size int64
			for _, p := range rep.Partitions {
				names = append(names, p.Name)
				files += p.Files
				rows += p.Rows
				size += p.Bytes
			}
			if !reflect.DeepEqual(names, tc.partitions) {
				t.Errorf("partitions %v, want %v", names, tc.partitions)
			}
			// 11:30 cuts through hour 11, whose first files hold only
			// earlier records: their row groups are skipped unread.
			if skip := !tc.opts.From.IsZero(); skip != (rep.SkippedRowGroups > 0) || rep.SkippedRowGroups >= rep.RowGroups {
				t.Errorf("%d of %d row groups skipped", rep.SkippedRowGroups, rep.RowGroups)
			}
			if files != rep.Files || rows != rep.FileRows || size != rep.DiskBytes || rep.Files < len(tc.partitions)*2 {
				t.Errorf("files %d rows %d bytes %d; partitions add up to %d %d %d (want ≥ 2 files per partition: roll_size is small)",
					rep.Files, rep.FileRows, rep.DiskBytes, files, rows, size)
			}
			if disk := diskUsage(t, dir, tc.partitions); disk != rep.DiskBytes {
				t.Errorf("bytes on disk %d, files sum to %d", rep.DiskBytes, disk)
			}
		})
	}
}

// checkRows compares a report with the rows and totals computed from the
// records, and checks the sort order.
func checkRows(t *testing.T, rep *Report, by []string, want map[string]Row, total Totals) {
	t.Helper()
	var cols []string
	for _, d := range rep.By {
		cols = append(cols, d.Name)
	}
	if !reflect.DeepEqual(cols, by) {
		t.Errorf("report by %v, want %v", cols, by)
	}
	got := byKey(rep.Rows)
	if len(got) != len(rep.Rows) {
		t.Errorf("%d rows, %d distinct keys", len(rep.Rows), len(got))
	}
	if !reflect.DeepEqual(got, want) {
		n := 0
		for k, w := range want {
			if g := got[k]; g.Records != w.Records || g.Packets != w.Packets || g.Bytes != w.Bytes {
				if n++; n <= 3 {
					t.Errorf("group %q: got %+v, want %+v", k, g, w)
				}
			}
		}
		t.Errorf("got %d rows, want %d; totals %+v, want %+v", len(got), len(want), rep.Total, total)
	}
	if rep.Total != total {
		t.Errorf("total %+v, want %+v", rep.Total, total)
	}
	for i := 1; i < len(rep.Rows); i++ {
		a, b := rep.Rows[i-1].Keys, rep.Rows[i].Keys
		for d, dim := range rep.By {
			x, y := a[d], b[d]
			if dim.Int {
				xi, _ := strconv.Atoi(x)
				yi, _ := strconv.Atoi(y)
				x, y = fmt.Sprintf("%011d", xi), fmt.Sprintf("%011d", yi)
			}
			if x < y {
				break
			}
			if x > y || d == len(rep.By)-1 {
				t.Fatalf("rows not sorted: %v before %v", a, b)
			}
		}
	}
}

// TestEveryDimension groups by each dimension alone and by all of them.
func TestEveryDimension(t *testing.T) {
	// 23:00-00:30: two days, two hours (day and hour are dimensions too).
	recs := parquettest.Flows(parquettest.Spec{Records: 20000, Start: time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC), Span: 90 * time.Minute})
	dir := writeWithSink(t, recs, 0)
	var everything []string
	cases := [][]string{}
	for _, d := range Dimensions {
		cases = append(cases, []string{d.Name})
		everything = append(everything, d.Name)
	}
	cases = append(cases, everything, []string{"external_network", "tenant", "direction"}, []string{"lb", "lb_segment"})
	for _, by := range cases {
		t.Run(strings.Join(by, ","), func(t *testing.T) {
			rep, err := Read(dir, Options{By: by})
			if err != nil {
				t.Fatal(err)
			}
			want, total := expect(recs, by, all)
			if len(want) < 2 {
				t.Fatalf("test data: %d distinct values of %v", len(want), by)
			}
			checkRows(t, rep, by, want, total)
		})
	}
}

// TestTimeBoundaries checks that [from, to) is exact to the microsecond
// on time_end, inside a partition, at hour boundaries and across row
// groups skipped or taken whole by their statistics.
func TestTimeBoundaries(t *testing.T) {
	h10 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	// Hand-made records: time_end right at, before and after the bounds.
	var recs []schemas.Flow
	base := parquettest.Flows(parquettest.Spec{Records: 16})
	for i, off := range []time.Duration{
		0, time.Microsecond, 30 * time.Minute, 30*time.Minute - time.Microsecond, 30*time.Minute + time.Microsecond,
		time.Hour - time.Microsecond, time.Hour, time.Hour + time.Microsecond, 90 * time.Minute, 2*time.Hour - time.Microsecond,
		2 * time.Hour, 150 * time.Minute, 3*time.Hour - time.Microsecond,
	} {
		f := base[i]
		f.TimeEnd = h10.Add(off).UnixMicro()
		f.TimeStart = f.TimeEnd - 1000
		f.Packets, f.Bytes = int64(1)<<i, int64(1000)<<i // each record is one bit
		recs = append(recs, f)
	}
	dir := writeWithSink(t, recs, 0)
	for _, tc := range []struct {
		name     string
		from, to time.Time
	}{
		{"open", time.Time{}, time.Time{}},
		{"one hour", h10, h10.Add(time.Hour)},
		{"half hours", h10.Add(30 * time.Minute), h10.Add(90 * time.Minute)},
		{"one microsecond", h10.Add(30 * time.Minute), h10.Add(30*time.Minute + time.Microsecond)},
		{"from only", h10.Add(time.Hour + time.Microsecond), time.Time{}},
		{"to only", time.Time{}, h10.Add(time.Microsecond)},
		{"sub-microsecond bounds", h10.Add(30*time.Minute - 500*time.Nanosecond), h10.Add(time.Hour + 1)},
		{"nothing", h10.Add(time.Second), h10.Add(2 * time.Second)},
		{"after the data", h10.Add(5 * time.Hour), h10.Add(6 * time.Hour)},
		{"a later hour, whole", h10.Add(2 * time.Hour), h10.Add(3 * time.Hour)},
		{"to at a row group's last record", h10.Add(2 * time.Hour), h10.Add(3*time.Hour - time.Microsecond)},
		{"from at a row group's last record", h10.Add(time.Hour - time.Microsecond), h10.Add(2 * time.Hour)},
		{"from after a row group's last record", h10.Add(time.Hour - 500*time.Nanosecond), h10.Add(2 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Read(dir, Options{From: tc.from, To: tc.to, By: []string{"direction"}})
			if err != nil {
				t.Fatal(err)
			}
			var want Totals
			for _, f := range recs {
				te := time.UnixMicro(f.TimeEnd)
				if (tc.from.IsZero() || !te.Before(tc.from)) && (tc.to.IsZero() || te.Before(tc.to)) {
					want.Records++
					want.Packets += f.Packets
					want.Bytes += f.Bytes
				}
			}
			if rep.Total != want {
				t.Errorf("total %+v (packets %b), want %+v (packets %b)", rep.Total, rep.Total.Packets, want, want.Packets)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]time.Time{
		"2026-11-29":                  time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"2026-11-29T10":               time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		"2026-11-29T10:30":            time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC),
		"2026-11-29T10:30:05":         time.Date(2026, 11, 29, 10, 30, 5, 0, time.UTC),
		"2026-11-29T10:30:05Z":        time.Date(2026, 11, 29, 10, 30, 5, 0, time.UTC),
		"2026-11-29T12:30:05.5+02:00": time.Date(2026, 11, 29, 10, 30, 5, 5e8, time.UTC),
	} {
		got, err := ParseTime(in)
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yesterday", "2026-13-01", "2026-11-29 10:00", "1732870000"} {
		if _, err := ParseTime(in); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
			t.Errorf("ParseTime(%q): %v", in, err)
		}
	}
	if by, err := ParseBy("tenant, zone_id"); err == nil {
		t.Errorf("ParseBy accepted zone_id: %v", by)
	}
	if by, err := ParseBy("tenant_id,lb,lb_segment"); err != nil || !reflect.DeepEqual(by, []string{"tenant", "lb", "lb_segment"}) {
		t.Errorf("ParseBy: %v, %v", by, err)
	}
	for _, in := range []string{"", "tenant,,zone", "tenant,tenant_id", "bytes"} {
		if _, err := ParseBy(in); err == nil {
			t.Errorf("ParseBy(%q) accepted", in)
		}
	}
	z := slices.Clone(parquettest.Zones)
	slices.Sort(z)
	zz := slices.Clone(Zones)
	slices.Sort(zz)
	if !reflect.DeepEqual(z, zz) {
		t.Errorf("Zones %v, the generator has %v", Zones, parquettest.Zones)
	}
}

func TestOptionErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "flows"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{By: []string{"tenant", "colour"}}, `unknown dimension "colour"`},
		{Options{From: h, To: h}, "is not before --to"},
		{Options{From: h.Add(time.Hour), To: h}, "is not before --to"},
		{Options{Zone: "extrnal"}, "use one of same_tenant"},
		{Options{Format: "xml"}, "use table, csv or json"},
	} {
		if err := Run(io.Discard, dir, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.opts, err, tc.want)
		}
	}
}

func diskUsage(t *testing.T, dir string, parts []string) int64 {
	t.Helper()
	var n int64
	for _, p := range parts {
		m, _ := filepath.Glob(filepath.Join(dir, "flows", p, "*.parquet"))
		for _, f := range m {
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			n += st.Size()
		}
	}
	return n
}

func TestRunPrintsAlignedTable(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 5000, Tenants: 3, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC), Span: 90 * time.Minute})
	dir := writeWithSink(t, recs, 0)
	// Temp files and dot directories are not committed data.
	part := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10")
	for _, p := range []string{filepath.Join(part, ".test@x-9.parquet.tmp"), filepath.Join(dir, "flows", ".trash", "old.parquet")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		opts Options
		by   []string
	}{
		{"default", Options{}, DefaultBy},
		{"demo grouping", Options{By: []string{"tenant", "zone", "direction", "external_network"}, Format: "table"}, []string{"tenant", "zone", "direction", "external_network"}},
		{"lb_segment first", Options{By: []string{"lb_segment", "node"}}, []string{"lb_segment", "node"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Run(&out, dir, tc.opts); err != nil {
				t.Fatal(err)
			}
			text := out.String()
			lines := strings.Split(text, "\n")
			want, total := expect(recs, tc.by, all)
			if len(lines) < len(want)+4 {
				t.Fatalf("%d lines for %d rows:\n%s", len(lines), len(want), text)
			}
			table := lines[:len(want)+4] // header, rule, rows, rule, total
			for i, l := range table {
				if len(l) != len(table[0]) {
					t.Errorf("table line %d is %d wide, header %d:\n%s", i, len(l), len(table[0]), text)
					break
				}
			}
			var header []string
			for _, d := range tc.by {
				dim, _ := LookupDimension(d)
				header = append(header, dim.Column)
			}
			if f := strings.Fields(table[0]); !reflect.DeepEqual(f, append(header, "records", "packets", "bytes", "size")) {
				t.Errorf("header %q", table[0])
			}
			n := len(tc.by)
			if f := strings.Fields(table[len(table)-1]); !reflect.DeepEqual(f, append([]string{"TOTAL", itoa(total.Records), itoa(total.Packets), itoa(total.Bytes)}, strings.Fields(human(total.Bytes))...)) {
				t.Errorf("totals line %q, want %d %d %d", table[len(table)-1], total.Records, total.Packets, total.Bytes)
			}
			for _, l := range table[2 : len(table)-2] {
				f := strings.Fields(l)
				keys := f[:n]
				for i, k := range keys {
					if k == "-" {
						keys[i] = ""
					}
				}
				r, ok := want[strings.Join(keys, "\x00")]
				if !ok || itoa(r.Records) != f[n] || itoa(r.Packets) != f[n+1] || itoa(r.Bytes) != f[n+2] || human(r.Bytes) != f[n+3]+" "+f[n+4] {
					t.Errorf("line %q: want %+v", l, r)
				}
			}
			for _, s := range []string{"files: 2  rows: 5000  bytes on disk: ", "partitions (2):", "dt=2026-11-29/hour=10", "dt=2026-11-29/hour=11"} {
				if !strings.Contains(text, s) {
					t.Errorf("output lacks %q:\n%s", s, text)
				}
			}
		})
	}
}

// TestFormats checks csv and json against the records, with and without
// names, and the table's name columns.
func TestFormats(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	recs := parquettest.Flows(parquettest.Spec{Records: 8000, Tenants: 4, Ports: 40, Start: start, Span: 90 * time.Minute})
	dir := writeWithSink(t, recs, 0)
	// An inventory naming two of the tenants, one server and one LB.
	var lb string
	other := 1
	for i, f := range recs {
		if lb == "" && f.LBID != "" {
			lb = f.LBID
		}
		if recs[other].TenantID == recs[0].TenantID {
			other = i
		}
	}
	inv := &inventory.Inventory{
		Projects:      []inventory.Project{{ID: recs[0].TenantID, Name: "acme"}, {ID: recs[other].TenantID, Name: "globex, inc"}},
		Servers:       []inventory.Server{{ID: recs[0].ServerID, Name: "web-1"}},
		LoadBalancers: []inventory.LoadBalancer{{ID: lb, Name: "front"}},
	}
	names := NamesOf(inv)
	from, to := start.Add(10*time.Minute), start.Add(70*time.Minute)
	keep := func(f *schemas.Flow) bool { return f.TimeEnd >= from.UnixMicro() && f.TimeEnd < to.UnixMicro() }
	nameOf := map[string]map[string]string{
		"tenant": {recs[0].TenantID: "acme", recs[other].TenantID: "globex, inc"},
		"server": {recs[0].ServerID: "web-1"},
		"lb":     {lb: "front"},
	}
	for _, tc := range []struct {
		by    []string
		names *Names
	}{
		{DefaultBy, nil},
		{[]string{"tenant", "server", "lb", "lb_segment"}, names},
		{[]string{"external_network", "port", "ifname"}, names},
	} {
		opts := Options{By: tc.by, From: from, To: to, Names: tc.names}
		want, total := expect(recs, tc.by, keep)
		t.Run("csv "+strings.Join(tc.by, ","), func(t *testing.T) {
			opts.Format = "csv"
			var out bytes.Buffer
			if err := Run(&out, dir, opts); err != nil {
				t.Fatal(err)
			}
			lines, err := csv.NewReader(&out).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			var header []string
			for _, d := range tc.by {
				dim, _ := LookupDimension(d)
				header = append(header, dim.Column)
				if tc.names != nil && dim.NameField != "" {
					header = append(header, dim.NameField)
				}
			}
			header = append(header, "records", "packets", "bytes")
			if !reflect.DeepEqual(lines[0], header) {
				t.Fatalf("header %v, want %v", lines[0], header)
			}
			var sum Totals
			for _, l := range lines[1:] {
				var keys []string
				i := 0
				for _, d := range tc.by {
					keys = append(keys, l[i])
					i++
					dim, _ := LookupDimension(d)
					if tc.names != nil && dim.NameField != "" {
						if l[i] != nameOf[d][l[i-1]] {
							t.Errorf("%s of %q is %q, want %q", dim.NameField, l[i-1], l[i], nameOf[d][l[i-1]])
						}
						i++
					}
				}
				r, ok := want[strings.Join(keys, "\x00")]
				if !ok || l[i] != itoa(r.Records) || l[i+1] != itoa(r.Packets) || l[i+2] != itoa(r.Bytes) {
					t.Errorf("line %v: want %+v", l, r)
				}
				n, _ := strconv.ParseInt(l[i+2], 10, 64)
				sum.Bytes += n
				sum.Records++
			}
			if sum.Bytes != total.Bytes || sum.Records != int64(len(want)) {
				t.Errorf("csv sums to %d bytes in %d lines, want %d in %d", sum.Bytes, sum.Records, total.Bytes, len(want))
			}
		})
		t.Run("json "+strings.Join(tc.by, ","), func(t *testing.T) {
			opts.Format = "json"
			var out bytes.Buffer
			if err := Run(&out, dir, opts); err != nil {
				t.Fatal(err)
			}
			var doc struct {
				By     []string          `json:"by"`
				From   *time.Time        `json:"from"`
				To     *time.Time        `json:"to"`
				Filter map[string]string `json:"filter"`
				Rows   []map[string]any  `json:"rows"`
				Total  map[string]int64  `json:"total"`
				Files  int               `json:"files"`
			}
			var loose map[string]any
			if err := json.Unmarshal(out.Bytes(), &loose); err != nil {
				t.Fatalf("%v:\n%s", err, out.String())
			}
			if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"by", "from", "to", "filter", "rows", "total", "files", "file_rows", "disk_bytes"} {
				if _, ok := loose[k]; !ok {
					t.Errorf("no %q in %s", k, out.String())
				}
			}
			if doc.From == nil || !doc.From.Equal(from) || doc.To == nil || !doc.To.Equal(to) {
				t.Errorf("from %v to %v", doc.From, doc.To)
			}
			if doc.Total["records"] != total.Records || doc.Total["packets"] != total.Packets || doc.Total["bytes"] != total.Bytes {
				t.Errorf("total %v, want %+v", doc.Total, total)
			}
			if len(doc.Rows) != len(want) {
				t.Errorf("%d rows, want %d", len(doc.Rows), len(want))
			}
			for _, row := range doc.Rows {
				var keys []string
				for _, d := range tc.by {
					dim, _ := LookupDimension(d)
					v := row[dim.Column]
					if dim.Int {
						n, ok := v.(float64)
						if !ok {
							t.Fatalf("%s is %T, want a number", dim.Column, v)
						}
						v = strconv.Itoa(int(n))
					}
					keys = append(keys, v.(string))
					if tc.names != nil && dim.NameField != "" && row[dim.NameField] != nameOf[d][v.(string)] {
						t.Errorf("%s of %v is %v", dim.NameField, v, row[dim.NameField])
					}
				}
				r := want[strings.Join(keys, "\x00")]
				if row["records"] != float64(r.Records) || row["packets"] != float64(r.Packets) || row["bytes"] != float64(r.Bytes) {
					t.Errorf("row %v: want %+v", row, r)
				}
			}
		})
	}
	t.Run("table with names", func(t *testing.T) {
		var out bytes.Buffer
		if err := Run(&out, dir, Options{By: []string{"tenant", "lb"}, Names: names}); err != nil {
			t.Fatal(err)
		}
		header := strings.Fields(strings.SplitN(out.String(), "\n", 2)[0])
		if !reflect.DeepEqual(header, []string{"tenant_id", "tenant_name", "lb_id", "lb_name", "records", "packets", "bytes", "size"}) {
			t.Errorf("header %v", header)
		}
		for _, s := range []string{recs[0].TenantID + "  acme ", "globex, inc", "  front  "} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("table lacks %q:\n%s", s, out.String())
			}
		}
	})
}

func TestLoadNames(t *testing.T) {
	p := filepath.Join(t.TempDir(), "inv.yaml")
	if err := os.WriteFile(p, []byte("projects:\n  - id: t1\n    name: acme\nservers:\n  - id: s1\n    name: web-1\nports:\n  - id: p1\n    name: eth0\n    network_id: n1\n    project_id: t1\n    mac_address: fa:16:3e:00:00:01\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := LoadNames(p)
	if err != nil {
		t.Fatal(err)
	}
	if n.name("tenant_name", "t1") != "acme" || n.name("server_name", "s1") != "web-1" || n.name("port_name", "p1") != "eth0" || n.name("lb_name", "x") != "" {
		t.Errorf("names %+v", n.byField)
	}
	if _, err := LoadNames(filepath.Join(t.TempDir(), "nope.yaml")); err == nil {
		t.Error("no error for a missing file")
	}
}

func TestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the path the error must name
		want  string
	}{
		{
			name:  "no flows directory",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "flows") },
			want:  "point --data at the collector output",
		},
		{
			name: "truncated file",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10", "x-1-1.parquet")
				writeFlows(t, p, schemas.SchemaName)
				b, _ := os.ReadFile(p)
				if err := os.WriteFile(p, b[:len(b)/2], 0o644); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: "move it out of",
		},
		{
			name: "not flow.v1",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10", "x-1-1.parquet")
				writeFlows(t, p, "flow.v0")
				return p
			},
			want: `tapflow.schema="flow.v0"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.setup(t, dir)
			err := Run(io.Discard, dir, Options{})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want it to name %s and say %q", err, path, tc.want)
			}
		})
	}
}

func writeFlows(t *testing.T, p, schema string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pq.NewGenericWriter[schemas.Flow](f, pq.KeyValueMetadata(schemas.MetadataKey, schema))
	if _, err := w.Write(parquettest.Flows(parquettest.Spec{Records: 3000})); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHuman(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 40 << 20: "40.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := human(in); got != want {
			t.Errorf("human(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestReadLargeRowGroups reads row groups whose column chunks span many
// pages, with page boundaries at different rows in each column.
func TestReadLargeRowGroups(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 300_000, Span: 30 * time.Minute, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)})
	dir := writeWithSink(t, recs, 0)
	rep, err := Read(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, total := expect(recs, DefaultBy, all)
	checkRows(t, rep, DefaultBy, want, total)
	// The data really spans several pages per column chunk.
	m, _ := filepath.Glob(filepath.Join(dir, "flows", "*", "*", "*.parquet"))
	if len(m) != 1 {
		t.Fatalf("files %v", m)
	}
	f, err := os.Open(m[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := pq.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := pf.Schema().Lookup("packets")
	oi, err := pf.RowGroups()[0].ColumnChunks()[leaf.ColumnIndex].OffsetIndex()
	if err != nil || oi.NumPages() < 3 {
		t.Fatalf("packets chunk has %v pages (%v); want several", oi, err)
	}
}

func TestNoFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(&out, dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "no committed Parquet files\n" {
		t.Fatalf("output %q", got)
	}
	out.Reset()
	if err := Run(&out, dir, Options{From: time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "no committed Parquet files with time_end in [2026-11-29T11:00:00Z, +∞)\n" {
		t.Fatalf("output %q", got)
	}
}

// TestMixedMinorVersions: a directory holding files of flow.v1.0 (before
// pool_id and member_id) and of the current minor reads as one: the old
// files' rows group under member "" (issue 14 item 3).
func TestMixedMinorVersions(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 20000, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC), Span: 90 * time.Minute})
	var old, cur []schemas.Flow
	for i, r := range recs {
		if i%3 == 0 {
			old = append(old, r)
		} else {
			cur = append(cur, r)
		}
	}
	dir := writeWithSink(t, cur, 0)
	files, err := parquettest.WriteOlderMinor(dir, "old-writer", 0, old)
	if err != nil || len(files) < 2 {
		t.Fatalf("old files %v: %v", files, err)
	}
	for i := range old {
		old[i].PoolID, old[i].MemberID, old[i].LBTap = "", "", "" // what the old files hold
	}
	mixed := append(old, cur...)
	for _, by := range [][]string{{"member"}, {"lb", "pool", "member"}, {"tenant", "zone"}} {
		t.Run(strings.Join(by, ","), func(t *testing.T) {
			rep, err := Read(dir, Options{By: by})
			if err != nil {
				t.Fatal(err)
			}
			want, total := expect(mixed, by, all)
			checkRows(t, rep, by, want, total)
		})
	}
}

// TestLBBytesOnce: per-load-balancer totals count every byte once (issue
// 21 item 8). Segment 2 is recorded at the amphora's tap and again at the
// member's; --by lb sums the amphora's side (lb_tap amphora) and leaves
// the member's copy under lb ”, so the per-LB figures equal the bytes of
// the transfers exactly, and the report's total stays every record's.
func TestLBBytesOnce(t *testing.T) {
	tr := parquettest.LBFlows(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	dir := writeWithSink(t, tr.Flows, 0)
	var all Totals
	for _, f := range tr.Flows {
		all.Records++
		all.Bytes += f.Bytes
	}
	tests := []struct {
		by   []string
		want func(parquettest.LBSegment) (string, bool) // row key of an LB segment, and whether that row holds only it
	}{
		{[]string{"lb", "lb_segment"}, func(s parquettest.LBSegment) (string, bool) { return fmt.Sprintf("%s\x00%d", s.LB, s.Segment), true }},
		{[]string{"lb"}, func(s parquettest.LBSegment) (string, bool) { return s.LB, false }},
		{[]string{"tenant", "lb"}, nil},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.by, ","), func(t *testing.T) {
			rep, err := Read(dir, Options{By: tc.by})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Total.Records != all.Records || rep.Total.Bytes != all.Bytes {
				t.Fatalf("total %+v, want every record: %+v", rep.Total, all)
			}
			got := byKey(rep.Rows)
			if tc.want == nil {
				want, _ := expect(tr.Flows, tc.by, func(*schemas.Flow) bool { return true })
				for k, w := range want {
					if got[k].Bytes != w.Bytes {
						t.Errorf("%q: %d bytes, want %d", k, got[k].Bytes, w.Bytes)
					}
				}
				return
			}
			perKey := map[string]int64{}
			for s, b := range tr.Once {
				k, _ := tc.want(s)
				perKey[k] += b
			}
			for k, b := range perKey {
				if got[k].Bytes != b {
					t.Errorf("lb %q: %d bytes, want %d (each transfer once)", k, got[k].Bytes, b)
				}
			}
			seg2 := tr.Twice[parquettest.LBSegment{LB: "lb-a", Segment: 2}]
			if once := tr.Once[parquettest.LBSegment{LB: "lb-a", Segment: 2}]; seg2 != 2*once || once == 0 {
				t.Fatalf("the data does not record segment 2 at both taps: %d, %d", seg2, once)
			}
		})
	}
	// lb_tap shows both sides: the member's copy equals the amphora's segment 2.
	rep, err := Read(dir, Options{By: []string{"lb_tap", "lb_segment"}})
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(rep.Rows)
	var seg2 int64
	for s, b := range tr.Once {
		if s.Segment == 2 {
			seg2 += b
		}
	}
	if got["amphora\x002"].Bytes != seg2 || got["member\x002"].Bytes != seg2 {
		t.Fatalf("segment 2 at the amphora %d, at the member %d; want %d each", got["amphora\x002"].Bytes, got["member\x002"].Bytes, seg2)
	}
}
