package lab

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/audit"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/schemas"
)

// ReadFlows reads every committed flow.v1 file under dataDir/flows.
func ReadFlows(dataDir string) ([]schemas.Flow, error) {
	return readParquet[schemas.Flow](filepath.Join(dataDir, "flows"))
}

// ReadMeterRecords reads every committed meter.v1 file under
// dataDir/meters (none yet: nil).
func ReadMeterRecords(dataDir string) ([]schemas.Meter, error) {
	root := filepath.Join(dataDir, "meters")
	if _, err := os.Stat(root); os.IsNotExist(err) {
		return nil, nil
	}
	return readParquet[schemas.Meter](root)
}

func readParquet[T any](root string) ([]T, error) {
	var out []T
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") || filepath.Ext(p) != ".parquet" {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		rows, err := pq.Read[T](f, st.Size())
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		out = append(out, rows...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lab: read Parquet under %s: %w", root, err)
	}
	return out, nil
}

// Meter is one tap and direction's kernel meter over the whole run.
type Meter struct {
	Ifname, Direction              string
	Packets, Bytes                 int64
	LostPackets, LostBytes, Failed int64
}

// MetersFromRecords sums meter.v1 records per tap and direction.
func MetersFromRecords(recs []schemas.Meter) map[[2]string]*Meter {
	out := map[[2]string]*Meter{}
	for i := range recs {
		r := &recs[i]
		k := [2]string{r.Ifname, r.Direction}
		m := out[k]
		if m == nil {
			m = &Meter{Ifname: r.Ifname, Direction: r.Direction}
			out[k] = m
		}
		m.Packets += r.Packets
		m.Bytes += r.Bytes
		m.LostPackets += r.LostPackets
		m.LostBytes += r.LostBytes
		m.Failed += r.FailedUpdates
	}
	return out
}

// ReadMeters reads the capture's per-interface totals from tapflow's log
// (the "interface meter totals" line each interface gets when it is
// released: at shutdown, or when it vanished).
func ReadMeters(logPath string) map[[2]string]*Meter {
	out := map[[2]string]*Meter{}
	for _, e := range ReadLog(logPath) {
		if e.Msg != "interface meter totals" {
			continue
		}
		k := [2]string{e.Ifname, e.Direction}
		m := out[k]
		if m == nil {
			m = &Meter{Ifname: e.Ifname, Direction: e.Direction}
			out[k] = m
		}
		m.Packets += e.Packets
		m.Bytes += e.Bytes
		m.LostPackets += e.LostPackets
		m.LostBytes += e.LostBytes
		m.Failed += e.FailedUpdates
	}
	return out
}

// Conservation compares, for every tap and direction, Σ record bytes and
// packets in Parquet with the kernel meter minus what the kernel reports
// lost.
type Conservation struct {
	Taps          int   // tap × direction pairs compared
	Bytes         int64 // Σ meter bytes
	Packets       int64
	Lost          int64 // lost bytes reported by the kernel
	Duplicates    int   // records whose (agent_id, batch_seq, record_index) repeats
	Mismatches    []string
	Unattributed  int // records with metadata_version 0
	RecordsNoTap  []string
	FlowRecords   int
	FlowByteTotal int64
	// Source says where the meters came from: meter.v1 Parquet records
	// (cross-checked against the log totals when both exist) or the
	// capture's per-interface totals in tapflow's log.
	Source string
}

// merge adds another agent's conservation to c.
func (c Conservation) merge(o Conservation) Conservation {
	c.Taps += o.Taps
	c.Bytes += o.Bytes
	c.Packets += o.Packets
	c.Lost += o.Lost
	c.Duplicates += o.Duplicates
	c.Mismatches = append(c.Mismatches, o.Mismatches...)
	c.Unattributed += o.Unattributed
	c.RecordsNoTap = append(c.RecordsNoTap, o.RecordsNoTap...)
	c.FlowRecords += o.FlowRecords
	c.FlowByteTotal += o.FlowByteTotal
	return c
}

// OK reports byte-exact conservation with nothing lost and no duplicate.
func (c Conservation) OK() bool {
	return len(c.Mismatches) == 0 && c.Lost == 0 && c.Duplicates == 0 && len(c.RecordsNoTap) == 0 && c.Taps > 0
}

func (c Conservation) String() string {
	s := fmt.Sprintf("%d tap×direction pairs, %d records, Σ %d bytes / %d packets = kernel meters (%s), lost %d, duplicates %d",
		c.Taps, c.FlowRecords, c.Bytes, c.Packets, c.Source, c.Lost, c.Duplicates)
	if !c.OK() {
		s = "VIOLATED: " + s
		for _, m := range c.Mismatches {
			s += "\n    " + m
		}
		for _, m := range c.RecordsNoTap {
			s += "\n    records of " + m + " but no meter"
		}
	}
	return s
}

// CheckConservation compares flows with meters.
func CheckConservation(flows []schemas.Flow, meters map[[2]string]*Meter) Conservation {
	type sum struct{ b, p int64 }
	got := map[[2]string]*sum{}
	ids := map[string]bool{}
	var c Conservation
	c.FlowRecords = len(flows)
	for i := range flows {
		f := &flows[i]
		k := [2]string{f.Ifname, f.Direction}
		s := got[k]
		if s == nil {
			s = &sum{}
			got[k] = s
		}
		s.b += f.Bytes
		s.p += f.Packets
		c.FlowByteTotal += f.Bytes
		id := fmt.Sprintf("%s/%d/%d", f.AgentID, f.BatchSeq, f.RecordIndex)
		if ids[id] {
			c.Duplicates++
		}
		ids[id] = true
		if f.MetadataVersion == 0 {
			c.Unattributed++
		}
	}
	keys := make([][2]string, 0, len(meters))
	for k := range meters {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	for _, k := range keys {
		m := meters[k]
		c.Taps++
		c.Bytes += m.Bytes
		c.Packets += m.Packets
		c.Lost += m.LostBytes
		s := got[k]
		if s == nil {
			s = &sum{}
		}
		if s.b != m.Bytes-m.LostBytes || s.p != m.Packets-m.LostPackets {
			c.Mismatches = append(c.Mismatches, fmt.Sprintf("%s %s: records %d bytes / %d packets, meter %d / %d, lost %d / %d",
				k[0], k[1], s.b, s.p, m.Bytes, m.Packets, m.LostBytes, m.LostPackets))
		}
	}
	for k := range got {
		if meters[k] == nil {
			c.RecordsNoTap = append(c.RecordsNoTap, k[0]+" "+k[1])
		}
	}
	slices.Sort(c.RecordsNoTap)
	return c
}

// Row is one line of the usage table.
type Row struct {
	Tenant, Zone, Direction, ExternalNetwork string
	Records                                  int
	Packets, Bytes                           int64
}

// Table sums flows by tenant (project name), zone, direction and
// external network, largest first.
func (c *Cloud) Table(flows []schemas.Flow) []Row {
	type k struct{ t, z, d, e string }
	m := map[k]*Row{}
	for i := range flows {
		f := &flows[i]
		key := k{c.tenantName(f.TenantID), f.Zone, f.Direction, f.ExternalNetwork}
		r := m[key]
		if r == nil {
			r = &Row{Tenant: key.t, Zone: key.z, Direction: key.d, ExternalNetwork: key.e}
			m[key] = r
		}
		r.Records++
		r.Packets += f.Packets
		r.Bytes += f.Bytes
	}
	out := make([]Row, 0, len(m))
	for _, r := range m {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.ExternalNetwork, b.ExternalNetwork))
	})
	return out
}

func (c *Cloud) tenantName(id string) string {
	if p := c.ProjectByID(id); p != nil {
		return p.Name
	}
	return id
}

// PrintTable writes the table aligned.
func PrintTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\tzone\tdir\texternal_network\trecords\tpackets\tbytes\t\t")
	var tot Row
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t\n", r.Tenant, r.Zone, r.Direction, r.ExternalNetwork, r.Records, r.Packets, r.Bytes, human(r.Bytes))
		tot.Records += r.Records
		tot.Packets += r.Packets
		tot.Bytes += r.Bytes
	}
	fmt.Fprintf(tw, "total\t\t\t\t%d\t%d\t%d\t%s\t\n", tot.Records, tot.Packets, tot.Bytes, human(tot.Bytes))
	tw.Flush()
}

func human(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// RunConservation checks a finished run's Parquet flows against its
// meters: meter.v1 records under dataDir/meters when the collector wrote
// any (and then they must also equal the kernel totals in the log), else
// the totals in the log.
func RunConservation(flows []schemas.Flow, dataDir, logPath string) (Conservation, error) {
	fromLog := ReadMeters(logPath)
	recs, err := ReadMeterRecords(dataDir)
	if err != nil {
		return Conservation{}, err
	}
	if len(recs) == 0 {
		c := CheckConservation(flows, fromLog)
		c.Source = "per-interface totals in tapflow's log"
		return c, nil
	}
	fromRecs := MetersFromRecords(recs)
	c := CheckConservation(flows, fromRecs)
	c.Source = fmt.Sprintf("%d meter.v1 records", len(recs))
	// And per node, tap, direction and hour, as tapflow audit checks it.
	out, err := dataset.Open(context.Background(), dataDir, dataset.Options{})
	if err != nil {
		return c, err
	}
	a, err := audit.Run(context.Background(), out, audit.Options{})
	if err != nil {
		return c, err
	}
	c.Source += fmt.Sprintf(", per hour as tapflow audit (%d key-hours)", len(a.Hours))
	if a.Verdict() == audit.NothingChecked {
		c.Mismatches = append(c.Mismatches, "audit: nothing checked: no key-hour of flows and meters in "+dataDir)
	}
	for _, m := range a.Mismatches {
		c.Mismatches = append(c.Mismatches, "audit: "+m.String())
	}
	if len(fromLog) > 0 {
		c.Source += ", = the log's totals"
		for k, a := range fromLog {
			b := fromRecs[k]
			if b == nil || a.Bytes != b.Bytes || a.Packets != b.Packets || a.LostBytes != b.LostBytes {
				c.Mismatches = append(c.Mismatches, fmt.Sprintf("%s %s: meter.v1 records %+v, kernel totals in the log %+v", k[0], k[1], b, a))
			}
		}
	}
	return c, nil
}
