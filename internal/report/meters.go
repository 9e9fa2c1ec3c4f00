package report

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/schemas"
)

// MeterDimensions are what a meters report groups by.
var MeterDimensions = []string{"day", "hour", "node", "ifname", "direction"}

// DefaultMeterBy is the grouping of `tapflow report --meters` without --by.
var DefaultMeterBy = []string{"node", "ifname", "direction"}

// MeterOptions shape a meters report: the kernel's own counts (meter.v1)
// per node, tap, direction, day or hour, with what it lost.
type MeterOptions struct {
	By       []string // of MeterDimensions; empty: DefaultMeterBy
	From, To time.Time
	Format   string // table, csv or json
}

// ParseMeterBy parses --by for --meters.
func ParseMeterBy(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "tap" {
			f = "ifname"
		}
		if !slices.Contains(MeterDimensions, f) {
			return nil, fmt.Errorf("--by %q: %q is not a meter dimension; with --meters use a comma-separated list of %s", s, f, strings.Join(MeterDimensions, ", "))
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("--by %q: %s is listed twice; name each dimension once", s, f)
		}
		out = append(out, f)
	}
	return out, nil
}

// MeterRow is one group of a meters report.
type MeterRow struct {
	Keys                                                    []string
	Records, Packets, Bytes, LostPackets, LostBytes, Failed int64
}

// MeterReport is what ReadMeters gathers.
type MeterReport struct {
	By    []string
	Rows  []MeterRow
	Total MeterRow
	Files int
}

type meterCols struct {
	TimeEnd       int64  `parquet:"time_end"`
	Node          string `parquet:"node"`
	Ifname        string `parquet:"ifname"`
	Direction     string `parquet:"direction"`
	Packets       int64  `parquet:"packets"`
	Bytes         int64  `parquet:"bytes"`
	LostPackets   int64  `parquet:"lost_packets"`
	LostBytes     int64  `parquet:"lost_bytes"`
	FailedUpdates int64  `parquet:"failed_updates"`
}

// ReadMeters sums the committed meter.v1 files under out's meters/.
func ReadMeters(ctx context.Context, out *dataset.Output, o MeterOptions) (*MeterReport, error) {
	by := o.By
	if len(by) == 0 {
		by = DefaultMeterBy
	}
	files, err := out.List(ctx, "meters")
	if err != nil {
		return nil, fmt.Errorf("report: %w; meters are written by agents with source: ebpf (under <output>/meters/)", err)
	}
	from, to := int64(minInt64), int64(maxInt64)
	if !o.From.IsZero() {
		from = ceilMicro(o.From)
	}
	if !o.To.IsZero() {
		to = ceilMicro(o.To)
	}
	groups := map[string]*MeterRow{}
	rep := &MeterReport{By: by}
	buf := make([]meterCols, 4096)
	for _, f := range files {
		if !inRange(f.Partition(), Options{From: o.From, To: o.To}) {
			continue
		}
		if err := func() error {
			rd, err := out.Open(ctx, f)
			if err != nil {
				return err
			}
			defer rd.Close()
			bad := func(err error) error {
				return fmt.Errorf("read %s: %w; it is not a complete meter.v1 Parquet file: move it out of its partition", out.Where(f), err)
			}
			pf, err := pq.OpenFile(rd, rd.Size(), pq.SkipBloomFilters(true), pq.SkipPageIndex(true))
			if err != nil {
				return bad(err)
			}
			if v, _ := pf.Lookup(schemas.MetadataKey); v != schemas.MeterSchemaName {
				return bad(fmt.Errorf("key-value metadata %s=%q, want %q", schemas.MetadataKey, v, schemas.MeterSchemaName))
			}
			r := pq.NewGenericReader[meterCols](pf)
			defer r.Close()
			for {
				n, err := r.Read(buf)
				for i := range buf[:n] {
					m := &buf[i]
					if m.TimeEnd < from || m.TimeEnd >= to {
						continue
					}
					keys := make([]string, len(by))
					for d, name := range by {
						switch name {
						case "day":
							keys[d] = time.UnixMicro(m.TimeEnd).UTC().Format("2006-01-02")
						case "hour":
							keys[d] = time.UnixMicro(m.TimeEnd).UTC().Format("2006-01-02T15Z")
						case "node":
							keys[d] = m.Node
						case "ifname":
							keys[d] = m.Ifname
						case "direction":
							keys[d] = m.Direction
						}
					}
					k := strings.Join(keys, "\x00")
					g := groups[k]
					if g == nil {
						g = &MeterRow{Keys: keys}
						groups[k] = g
					}
					for _, x := range []*MeterRow{g, &rep.Total} {
						x.Records++
						x.Packets += m.Packets
						x.Bytes += m.Bytes
						x.LostPackets += m.LostPackets
						x.LostBytes += m.LostBytes
						x.Failed += m.FailedUpdates
					}
				}
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return bad(err)
				}
			}
		}(); err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		rep.Files++
	}
	for _, g := range groups {
		rep.Rows = append(rep.Rows, *g)
	}
	slices.SortFunc(rep.Rows, func(a, b MeterRow) int { return slices.Compare(a.Keys, b.Keys) })
	return rep, nil
}

var meterFields = []string{"records", "packets", "bytes", "lost_packets", "lost_bytes", "failed_updates"}

func (r MeterRow) values() []int64 {
	return []int64{r.Records, r.Packets, r.Bytes, r.LostPackets, r.LostBytes, r.Failed}
}

// Write prints the meters report in format (table, csv, json).
func (m *MeterReport) Write(w io.Writer, format string) error {
	switch cmp.Or(format, "table") {
	case "table":
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(append(slices.Clone(m.By), meterFields...), "\t")+"\t")
		line := func(keys []string, r MeterRow) {
			cells := slices.Clone(keys)
			for _, v := range r.values() {
				cells = append(cells, strconv.FormatInt(v, 10))
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
		}
		for _, r := range m.Rows {
			line(r.Keys, r)
		}
		tot := make([]string, len(m.By))
		if len(tot) > 0 {
			tot[0] = "TOTAL"
		}
		line(tot, m.Total)
		if err := tw.Flush(); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "%d meter files, %d groups\n", m.Files, len(m.Rows))
		return err
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write(append(slices.Clone(m.By), meterFields...))
		for _, r := range m.Rows {
			rec := slices.Clone(r.Keys)
			for _, v := range r.values() {
				rec = append(rec, strconv.FormatInt(v, 10))
			}
			_ = cw.Write(rec)
		}
		cw.Flush()
		return cw.Error()
	case "json":
		rows := make([]map[string]any, 0, len(m.Rows))
		for _, r := range m.Rows {
			o := map[string]any{}
			for i, k := range m.By {
				o[k] = r.Keys[i]
			}
			for i, v := range r.values() {
				o[meterFields[i]] = v
			}
			rows = append(rows, o)
		}
		tot := map[string]any{}
		for i, v := range m.Total.values() {
			tot[meterFields[i]] = v
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"by": m.By, "rows": rows, "total": tot, "files": m.Files})
	}
	return fmt.Errorf("--format %q: unknown format; use table, csv or json", format)
}
