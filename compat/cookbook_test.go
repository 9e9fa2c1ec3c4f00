package compat

import (
	"cmp"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/schemas"
)

// expectation computes, in Go from the records written, the rows a
// cookbook query must return, each row rendered with fmt %v and joined by
// "|".
type expectation func(recs []schemas.Flow) []string

func day(us int64) string { return time.UnixMicro(us).UTC().Format(time.DateOnly) }

// sumBy groups recs by key and renders key|sum(val) rows sorted by key.
func sumBy(recs []schemas.Flow, keep func(*schemas.Flow) bool, key func(*schemas.Flow) string, vals ...func(*schemas.Flow) int64) []string {
	sums := map[string][]int64{}
	for i := range recs {
		r := &recs[i]
		if keep != nil && !keep(r) {
			continue
		}
		k := key(r)
		if sums[k] == nil {
			sums[k] = make([]int64, len(vals))
		}
		for j, v := range vals {
			sums[k][j] += v(r)
		}
	}
	var out []string
	keys := slices.Collect(maps.Keys(sums))
	// Sort as SQL does: column by column, not by the joined text.
	slices.SortFunc(keys, func(a, b string) int { return slices.Compare(strings.Split(a, "|"), strings.Split(b, "|")) })
	for _, k := range keys {
		row := k
		for _, s := range sums[k] {
			row += fmt.Sprintf("|%d", s)
		}
		out = append(out, row)
	}
	return out
}

func bytesOf(r *schemas.Flow) int64   { return r.Bytes }
func packetsOf(r *schemas.Flow) int64 { return r.Packets }
func one(*schemas.Flow) int64         { return 1 }

var expectations = map[string]expectation{
	"bytes_per_tenant_day": func(recs []schemas.Flow) []string {
		return sumBy(recs, nil, func(r *schemas.Flow) string { return r.TenantID + "|" + day(r.TimeEnd) + "|" + r.Direction }, bytesOf, packetsOf, one)
	},
	"external_egress": func(recs []schemas.Flow) []string {
		return sumBy(recs, func(r *schemas.Flow) bool { return r.Zone == "external" && r.Direction == "tx" },
			func(r *schemas.Flow) string { return r.TenantID + "|" + r.ExternalNetwork + "|" + day(r.TimeEnd) }, bytesOf)
	},
	"hourly_one_day": func(recs []schemas.Flow) []string {
		return sumBy(recs, func(r *schemas.Flow) bool {
			t := time.UnixMicro(r.TimeEnd).UTC()
			return t.Format(time.DateOnly) == "2026-11-29" && t.Hour() >= 22 && t.Hour() <= 23
		}, func(r *schemas.Flow) string {
			return fmt.Sprintf("%d|%s", time.UnixMicro(r.TimeEnd).UTC().Hour(), r.TenantID)
		}, bytesOf)
	},
	"cross_tenant": func(recs []schemas.Flow) []string {
		rows := sumBy(recs, func(r *schemas.Flow) bool { return r.Zone == "other_tenant" },
			func(r *schemas.Flow) string { return r.TenantID + "|" + r.PeerTenantID }, bytesOf)
		type kv struct {
			key   string
			bytes int64
		}
		var v []kv
		for _, r := range rows {
			i := strings.LastIndexByte(r, '|')
			var b int64
			fmt.Sscan(r[i+1:], &b)
			v = append(v, kv{r[:i], b})
		}
		slices.SortFunc(v, func(a, b kv) int { return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.key, b.key)) })
		var out []string
		for _, x := range v[:min(20, len(v))] {
			out = append(out, fmt.Sprintf("%s|%d", x.key, x.bytes))
		}
		return out
	},
	"load_balancers": func(recs []schemas.Flow) []string { // each byte once: not the member's copy (TestLoadBalancerBytesOnce)
		return sumBy(recs, func(r *schemas.Flow) bool { return r.LBID != "" && r.LBTap != schemas.LBTapMember },
			func(r *schemas.Flow) string { return fmt.Sprintf("%s|%d", r.LBID, r.LBSegment) }, bytesOf, one)
	},
	"member_bytes_hourly": func(recs []schemas.Flow) []string {
		type key struct {
			lb, pool, member, day string
			hour                  int
		}
		type agg struct {
			bytes int64
			taps  map[string]bool
		}
		m := map[key]*agg{}
		for i := range recs {
			r := &recs[i]
			if r.LBSegment != 2 || r.MemberID == "" {
				continue
			}
			t := time.UnixMicro(r.TimeEnd).UTC()
			k := key{r.LBID, r.PoolID, r.MemberID, day(r.TimeEnd), t.Hour()}
			if m[k] == nil {
				m[k] = &agg{taps: map[string]bool{}}
			}
			m[k].bytes += r.Bytes
			m[k].taps[r.Ifname] = true
		}
		keys := slices.Collect(maps.Keys(m))
		slices.SortFunc(keys, func(a, b key) int {
			return cmp.Or(cmp.Compare(a.lb, b.lb), cmp.Compare(a.pool, b.pool), cmp.Compare(a.member, b.member), cmp.Compare(a.day, b.day), cmp.Compare(a.hour, b.hour))
		})
		var out []string
		for _, k := range keys {
			out = append(out, fmt.Sprintf("%s|%s|%s|%s|%d|%d|%d", k.lb, k.pool, k.member, k.day, k.hour, m[k].bytes, len(m[k].taps)))
		}
		return out
	},
	"identity_audit": func(recs []schemas.Flow) []string {
		return []string{fmt.Sprintf("%d|%d", len(recs), len(recs))}
	},
	"unattributed_share": func(recs []schemas.Flow) []string {
		un := sumBy(recs, func(r *schemas.Flow) bool { return r.TenantID == "unknown" || r.Zone == "miss" }, func(r *schemas.Flow) string { return day(r.TimeEnd) }, bytesOf)
		all := sumBy(recs, nil, func(r *schemas.Flow) string { return day(r.TimeEnd) }, bytesOf)
		m := map[string]string{}
		for _, r := range un {
			m[r[:10]] = r[11:]
		}
		var out []string
		for _, r := range all {
			u := m[r[:10]]
			if u == "" {
				u = "<nil>"
			}
			out = append(out, r[:10]+"|"+u+"|"+r[11:])
		}
		return out
	},
	"file_metadata": nil, // checked below: one schema, every file
}

// render turns a DuckDB value into the text the expectations use.
func render(v any) string {
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.DateOnly)
	case []byte:
		return string(x)
	case nil:
		return "<nil>"
	}
	return fmt.Sprint(v)
}

func query(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%v\n%s", err, q)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = render(v)
		}
		out = append(out, strings.Join(parts, "|"))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCookbook runs every query of docs/queries.md on collector output and
// compares its result with the same figure computed from the records.
func TestCookbook(t *testing.T) {
	recs, dir := mixedOutput(t)
	names, queries := cookbook(t)
	if len(names) < 8 || names[0] != "setup" {
		t.Fatalf("docs/queries.md: found queries %v; the first must be setup", names)
	}
	db := openDB(t)
	for _, stmt := range strings.Split(strings.ReplaceAll(queries["setup"], placeholder, dir), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("setup: %v\n%s", err, stmt)
		}
	}
	for _, name := range names[1:] {
		t.Run(name, func(t *testing.T) {
			exp, ok := expectations[name]
			if !ok {
				t.Fatalf("query %s in docs/queries.md has no expectation in this test: add one", name)
			}
			start := time.Now()
			got := query(t, db, strings.ReplaceAll(queries[name], placeholder, dir))
			t.Logf("%s: %d rows in %s", name, len(got), time.Since(start).Round(time.Millisecond))
			if exp == nil {
				if len(got) != 1 || !strings.HasPrefix(got[0], schemas.SchemaName+"|") {
					t.Fatalf("got %v", got)
				}
				return
			}
			want := exp(recs)
			if len(want) == 0 {
				t.Fatal("the data set exercises nothing in this query: widen dataset()")
			}
			if !slices.Equal(got, want) {
				n := 0
				for n < min(len(got), len(want)) && got[n] == want[n] {
					n++
				}
				t.Fatalf("%d rows, want %d; first difference at row %d:\n got %q\nwant %q", len(got), len(want), n, at(got, n), at(want, n))
			}
		})
	}
	for name := range expectations {
		if _, ok := queries[name]; !ok {
			t.Errorf("expectation %s has no query in docs/queries.md", name)
		}
	}
}

func at(v []string, i int) string {
	if i < len(v) {
		return v[i]
	}
	return "(none)"
}

// TestLoadBalancerBytesOnce: the load_balancers query of docs/queries.md
// counts every byte once (issue 21 item 8). On load-balancer traffic as the
// taps record it — segment 2 at the amphora's tap and again at the
// member's — its per-LB, per-segment bytes equal the bytes of the
// transfers (each counted once, computed from the transfers, not the
// records); the query without the lb_tap filter gives the double count.
func TestLoadBalancerBytesOnce(t *testing.T) {
	tr := parquettest.LBFlows(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	dir := writeOutput(t, tr.Flows, 7)
	_, queries := cookbook(t)
	db := openDB(t)
	for _, stmt := range strings.Split(strings.ReplaceAll(queries["setup"], placeholder, dir), ";") {
		if strings.TrimSpace(stmt) != "" {
			if _, err := db.Exec(stmt); err != nil {
				t.Fatalf("setup: %v\n%s", err, stmt)
			}
		}
	}
	rowsOf := func(m map[parquettest.LBSegment]int64) map[string]int64 {
		out := map[string]int64{}
		for s, b := range m {
			out[fmt.Sprintf("%s|%d", s.LB, s.Segment)] = b
		}
		return out
	}
	bytesOf := func(q string) map[string]int64 {
		out := map[string]int64{}
		for _, r := range query(t, db, q) {
			f := strings.Split(r, "|") // lb_id|lb_segment|bytes|records
			var b int64
			fmt.Sscan(f[2], &b)
			out[f[0]+"|"+f[1]] = b
		}
		return out
	}
	got := bytesOf(strings.ReplaceAll(queries["load_balancers"], placeholder, dir))
	if want := rowsOf(tr.Once); !maps.Equal(got, want) {
		t.Fatalf("load_balancers: %v\nwant each transfer once: %v", got, want)
	}
	naive := bytesOf(`SELECT lb_id, lb_segment, sum(bytes), count(*) FROM flows WHERE lb_id <> '' GROUP BY ALL`)
	if want := rowsOf(tr.Twice); !maps.Equal(naive, want) || maps.Equal(naive, got) {
		t.Fatalf("without lb_tap: %v, want segment 2 twice: %v", naive, want)
	}
	t.Logf("per LB and segment, each byte once: %v (every record with lb_id: %v)", got, naive)
}
