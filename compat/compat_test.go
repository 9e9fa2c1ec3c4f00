package compat

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	_ "github.com/duckdb/duckdb-go/v2"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// placeholder is the output path the cookbook's queries use.
const placeholder = "/var/lib/tapflow"

// dataset is 20,000 generated records spanning 22:30–01:30 UTC (two days,
// four hours) plus edge cases, written by the real Parquet sink in batches
// of 1,000 (as from 20 JetStream messages).
func dataset() []schemas.Flow {
	recs := parquettest.Flows(parquettest.Spec{Records: 20_000, Start: time.Date(2026, 11, 29, 22, 30, 0, 0, time.UTC), Span: 3 * time.Hour, Tenants: 20, Ports: 300})
	edge := []schemas.Flow{
		{ // µs precision at an hour boundary, big counters, IPv6, empty optional strings
			TimeStart: time.Date(2026, 11, 29, 23, 59, 59, 999_999_000, time.UTC).UnixMicro(), TimeEnd: time.Date(2026, 11, 30, 0, 0, 0, 1_000, time.UTC).UnixMicro(),
			Node: "compute-édge", Ifname: "tap0", Direction: "rx", VMMAC: "fa:16:3e:00:00:01", PeerMAC: "", IPVersion: 6, Protocol: 58,
			SrcIP: "2001:db8::1", DstIP: "fe80::1", Packets: 1 << 40, Bytes: 1<<62 - 1, EndReason: "shutdown", TenantID: "unknown", Zone: "miss",
			ExternalNetwork: "none", AgentID: "agent-edge", BatchSeq: 1<<53 + 1, RecordIndex: 0, MetadataVersion: 1<<40 + 7,
		},
	}
	return append(recs, edge...)
}

// writeOutput runs the collector's Parquet sink over recs and returns the
// output root.
func writeOutput(t *testing.T, recs []schemas.Flow, batch int) string {
	t.Helper()
	return writeOutputCompressed(t, recs, batch, parquet.DefaultConfig().Compression)
}

// writeOutputCompressed is writeOutput with collector.compression set.
func writeOutputCompressed(t *testing.T, recs []schemas.Flow, batch int, compression string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := parquet.DefaultConfig()
	cfg.Output, cfg.Writer, cfg.Compression = dir, "compat", compression
	cfg.RollSize = 1 << 20 // several files per partition
	// The collector's path: messages as the agent encodes them, decoded
	// into schemas.Row and written from their Arrow columns. Messages
	// rotate through the current form (narrow dictionary indices), the
	// plain utf8 strings of agents before wire dictionaries and the int32
	// indices of agents before narrow ones (a rolling upgrade): files mix
	// all three, DuckDB must not tell.
	s, err := parquet.NewFor(cfg, parquet.FlowRowSchema, parquet.Options{Node: "compat"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	enc, err := schemas.NewEncoder(schemas.CodecZstd)
	if err != nil {
		t.Fatal(err)
	}
	encs := []*schemas.Encoder{enc, enc.PlainStrings(), enc.WideIndices()}
	dec := schemas.NewDecoderFor(schemas.FlowRows)
	in := make(chan *pipeline.BatchOf[schemas.Row], len(recs)/batch+1)
	failed := 0
	for i := 0; i < len(recs); i += batch {
		body, err := encs[i/batch%len(encs)].Encode(nil, recs[i:min(i+batch, len(recs))])
		if err != nil {
			t.Fatal(err)
		}
		rows, err := dec.Decode(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		b := pipeline.NewBatchOf(rows, func(err error) {
			if err != nil {
				failed++
			}
		})
		b.Seq = int64(i/batch + 1)
		in <- b
	}
	close(in)
	if err := s.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if failed > 0 {
		t.Fatalf("%d batches failed", failed)
	}
	return dir
}

// mixedOutput is dataset() in a directory that mixes minor versions, as
// after an upgrade: every fourth record in files of a flow.v1.0 writer
// (no pool_id, member_id, lb_tap), the rest from the collector's sink. It returns
// the records as the files hold them (the old ones without the new
// columns' values).
func mixedOutput(t *testing.T) ([]schemas.Flow, string) {
	t.Helper()
	var old, cur []schemas.Flow
	for i, r := range dataset() {
		if i%4 == 0 {
			r.PoolID, r.MemberID, r.LBTap = "", "", ""
			old = append(old, r)
		} else {
			cur = append(cur, r)
		}
	}
	dir := writeOutput(t, cur, 1000)
	if files, err := parquettest.WriteOlderMinor(dir, "v10-writer", 0, old); err != nil || len(files) < 4 {
		t.Fatalf("flow.v1.0 files %v: %v", files, err)
	}
	return append(old, cur...), dir
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // one connection: SET and views persist
	t.Cleanup(func() { db.Close() })
	return db
}

func glob(dir string) string { return filepath.Join(dir, "flows", "**", "*.parquet") }

// TestTypes: DuckDB sees the documented types, with and without typed
// hive columns.
func TestTypes(t *testing.T) {
	dir := writeOutput(t, dataset(), 1000)
	db := openDB(t)
	want := map[string]string{
		"time_start": "TIMESTAMP WITH TIME ZONE", "time_end": "TIMESTAMP WITH TIME ZONE",
		"packets": "BIGINT", "bytes": "BIGINT", "batch_seq": "BIGINT", "metadata_version": "BIGINT",
		"vlan_id": "INTEGER", "ip_version": "INTEGER", "protocol": "INTEGER", "src_port": "INTEGER", "dst_port": "INTEGER",
		"tcp_flags": "INTEGER", "lb_segment": "INTEGER", "record_index": "INTEGER",
	}
	for _, tc := range []struct {
		name, opts string
		dt, hour   string
	}{
		{"auto-detected partitions", "hive_partitioning = true", "DATE", "VARCHAR"},
		{"typed partitions (cookbook)", "hive_partitioning = true, hive_types = {'dt': DATE, 'hour': INTEGER}", "DATE", "INTEGER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := db.Query(fmt.Sprintf("DESCRIBE SELECT * FROM read_parquet('%s', %s)", glob(dir), tc.opts))
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			got := map[string]string{}
			var order []string
			for rows.Next() {
				var name, typ string
				var null, key, def, extra sql.NullString
				if err := rows.Scan(&name, &typ, &null, &key, &def, &extra); err != nil {
					t.Fatal(err)
				}
				got[name] = typ
				order = append(order, name)
			}
			cols := schemas.ParquetSchema().Fields()
			if len(order) != len(cols)+2 {
				t.Fatalf("%d columns %v, want the %d of flow.v1 + dt, hour", len(order), order, len(cols))
			}
			for _, f := range cols {
				w, ok := want[f.Name()]
				if !ok {
					w = "VARCHAR"
				}
				if got[f.Name()] != w {
					t.Errorf("column %s: DuckDB type %s, want %s", f.Name(), got[f.Name()], w)
				}
			}
			if got["dt"] != tc.dt || got["hour"] != tc.hour {
				t.Errorf("partition columns dt %s hour %s, want %s %s", got["dt"], got["hour"], tc.dt, tc.hour)
			}
		})
	}
	// Physical types: no unsigned ints, no nanosecond timestamps.
	q := fmt.Sprintf(`SELECT DISTINCT name, type, coalesce(converted_type, ''), coalesce(CAST(logical_type AS VARCHAR), '') FROM parquet_schema('%s')
		WHERE converted_type LIKE 'UINT%%' OR CAST(logical_type AS VARCHAR) LIKE '%%NANOS=Nano%%'
		   OR (name LIKE 'time_%%' AND (type <> 'INT64' OR CAST(logical_type AS VARCHAR) NOT LIKE '%%isAdjustedToUTC=1%%' OR CAST(logical_type AS VARCHAR) NOT LIKE '%%MICROS=Micro%%'))`, glob(dir))
	if bad := queryStrings(t, db, q); len(bad) > 0 {
		t.Fatalf("columns with unsigned, nanosecond or non-UTC-micros types: %v", bad)
	}
}

// TestExactRows: every record comes back from DuckDB exactly as written,
// in its hive partition.
func TestExactRows(t *testing.T) {
	recs := dataset()
	for _, c := range parquet.Compressions {
		t.Run(c, func(t *testing.T) {
			exactRows(t, recs, writeOutputCompressed(t, recs, 1000, c), c)
		})
	}
}

// codecNames are the Parquet codec names DuckDB reports per compression.
var codecNames = map[string]string{
	parquet.CompressionZstd: "ZSTD", parquet.CompressionZstdDefault: "ZSTD", parquet.CompressionSnappy: "SNAPPY",
	parquet.CompressionNone: "UNCOMPRESSED",
}

// exactRows: DuckDB reads back every record of dir exactly as written,
// and every column chunk says it is compressed with compression.
func exactRows(t *testing.T, recs []schemas.Flow, dir, compression string) {
	db := openDB(t)
	codec, ok := codecNames[compression]
	if !ok {
		t.Fatalf("no Parquet codec name for %q: add it to codecNames", compression)
	}
	if got := queryStrings(t, db, fmt.Sprintf("SELECT DISTINCT compression FROM parquet_metadata('%s')", glob(dir))); !slices.Equal(got, []string{codec}) {
		t.Fatalf("column chunks compressed with %v; want only %s", got, codec)
	}
	if _, err := db.Exec("SET TimeZone = 'UTC'"); err != nil {
		t.Fatal(err)
	}
	cols := []string{}
	for _, f := range schemas.ParquetSchema().Fields() {
		cols = append(cols, f.Name())
	}
	q := fmt.Sprintf(`SELECT %s, dt, hour FROM read_parquet('%s', hive_partitioning = true, hive_types = {'dt': DATE, 'hour': INTEGER})
		ORDER BY agent_id, batch_seq, record_index`, strings.Join(cols, ", "), glob(dir))
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := slices.Clone(recs)
	sort.Slice(want, func(i, j int) bool {
		a, b := want[i], want[j]
		if a.AgentID != b.AgentID {
			return a.AgentID < b.AgentID
		}
		if a.BatchSeq != b.BatchSeq {
			return a.BatchSeq < b.BatchSeq
		}
		return a.RecordIndex < b.RecordIndex
	})
	n := 0
	for rows.Next() {
		var f schemas.Flow
		var ts, te, dt time.Time
		var hour int
		dst := []any{&ts, &te, &f.Node, &f.Ifname, &f.Direction, &f.VMMAC, &f.PeerMAC, &f.VLANID, &f.IPVersion, &f.Protocol,
			&f.SrcIP, &f.DstIP, &f.SrcPort, &f.DstPort, &f.TCPFlags, &f.Packets, &f.Bytes, &f.EndReason, &f.TenantID,
			&f.ServerID, &f.PortID, &f.Zone, &f.PeerTenantID, &f.ExternalNetwork, &f.LBID, &f.LBSegment, &f.AgentID,
			&f.BatchSeq, &f.RecordIndex, &f.MetadataVersion, &f.PoolID, &f.MemberID, &f.LBTap, &dt, &hour}
		if len(dst) != len(cols)+2 {
			t.Fatalf("test scans %d columns, schema has %d: update the test", len(dst)-2, len(cols))
		}
		if err := rows.Scan(dst...); err != nil {
			t.Fatal(err)
		}
		f.TimeStart, f.TimeEnd = ts.UnixMicro(), te.UnixMicro()
		if n >= len(want) {
			t.Fatalf("more rows than written (%d)", len(want))
		}
		if f != want[n] {
			t.Fatalf("row %d differs:\n got %+v\nwant %+v", n, f, want[n])
		}
		end := time.UnixMicro(f.TimeEnd).UTC()
		if !dt.Equal(end.Truncate(24*time.Hour)) || hour != end.Hour() {
			t.Fatalf("row %d (time_end %s) in partition dt=%s hour=%d", n, end, dt.Format(time.DateOnly), hour)
		}
		if ts.Location() != time.UTC {
			t.Fatalf("time_start scanned in %s, want UTC", ts.Location())
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(want) {
		t.Fatalf("DuckDB read %d rows, %d were written", n, len(want))
	}
}

// TestMetadata: every file's footer names the schema, the writer and the
// batch sequences it holds; together they cover every batch once.
func TestMetadata(t *testing.T) {
	dir := writeOutput(t, dataset(), 1000)
	db := openDB(t)
	rows, err := db.Query(fmt.Sprintf(`SELECT file_name, decode(key), decode(value) FROM parquet_kv_metadata('%s') ORDER BY 1, 2`, glob(dir)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	meta := map[string]map[string]string{}
	for rows.Next() {
		var file, k, v string
		if err := rows.Scan(&file, &k, &v); err != nil {
			t.Fatal(err)
		}
		if meta[file] == nil {
			meta[file] = map[string]string{}
		}
		meta[file][k] = v
	}
	files, _ := filepath.Glob(filepath.Join(dir, "flows", "*", "*", "*.parquet"))
	if len(files) < 4 || len(meta) != len(files) {
		t.Fatalf("%d files with metadata, %d files on disk (want ≥ 4: four hours)", len(meta), len(files))
	}
	for f, kv := range meta {
		if kv[schemas.MetadataKey] != schemas.SchemaName || kv[schemas.VersionKey] != schemas.FlowTable.Version() || kv[parquet.MetadataWriter] != "compat" || kv[parquet.MetadataBatchSeqs] == "" {
			t.Errorf("%s: metadata %v", f, kv)
		}
	}
}

// cookbook returns the named SQL blocks of docs/queries.md.
func cookbook(t *testing.T) (names []string, queries map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "queries.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- query: ([a-z_]+) -->\\s*```sql\\n(.*?)```")
	queries = map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
		queries[m[1]] = m[2]
	}
	return names, queries
}

func queryStrings(t *testing.T, db *sql.DB, q string) []string { return query(t, db, q) }

// TestSchemaEvolution: a directory mixing flow.v1.0 files (before pool_id
// and member_id) and current ones reads with union_by_name: the new
// columns exist, are NULL on the old rows and hold the values on the new
// ones; no row is lost; every file says its minor version.
func TestSchemaEvolution(t *testing.T) {
	recs, dir := mixedOutput(t)
	db := openDB(t)
	src := fmt.Sprintf("read_parquet('%s', union_by_name = true)", glob(dir))
	types := map[string]string{}
	for _, r := range query(t, db, "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM "+src+")") {
		k, v, _ := strings.Cut(r, "|")
		types[k] = v
	}
	if types["pool_id"] != "VARCHAR" || types["member_id"] != "VARCHAR" || types["bytes"] != "BIGINT" {
		t.Fatalf("union_by_name types: %v", types)
	}
	var members int
	var total int64
	for _, r := range recs {
		total += r.Bytes
		if r.MemberID != "" {
			members++
		}
	}
	got := query(t, db, "SELECT count(*), sum(bytes)::VARCHAR, count(*) FILTER (WHERE member_id IS NULL), count(*) FILTER (WHERE member_id <> '') FROM "+src)
	var n, nulls, withMember int
	var sum int64
	if _, err := fmt.Sscanf(strings.ReplaceAll(got[0], "|", " "), "%d %d %d %d", &n, &sum, &nulls, &withMember); err != nil {
		t.Fatalf("%v: %v", got, err)
	}
	wantNulls := (len(dataset()) + 3) / 4
	if n != len(recs) || sum != total || nulls != wantNulls || withMember != members || members == 0 {
		t.Fatalf("rows %d (want %d), bytes %d (want %d), NULL member_id %d (want %d: the flow.v1.0 rows), member_id set %d (want %d)",
			n, len(recs), sum, total, nulls, wantNulls, withMember, members)
	}
	versions := query(t, db, fmt.Sprintf(`SELECT decode(value), count(*) FROM parquet_kv_metadata('%s')
		WHERE decode(key) = '%s' GROUP BY ALL ORDER BY 1`, glob(dir), schemas.VersionKey))
	if len(versions) != 2 || !strings.HasPrefix(versions[0], "1.0|") || !strings.HasPrefix(versions[1], schemas.FlowTable.Version()+"|") {
		t.Fatalf("file versions %v, want 1.0 and %s", versions, schemas.FlowTable.Version())
	}
}
