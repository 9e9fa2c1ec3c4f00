package flowlogs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/committest"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

var quiet = slog.New(slog.DiscardHandler)

// hour is the delivered hour; the data spans it and the hours around it.
var hour = time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)

// sourceFlows are three projects' records from 04:30 to 06:30 (so the
// hour has neighbours that must not be delivered), with other_tenant
// records naming the other projects as peers, load-balancer member copies,
// and unknown-tenant records.
func sourceFlows() ([]schemas.Flow, []string) {
	recs := parquettest.Flows(parquettest.Spec{Records: 6000, Tenants: 3, Ports: 60, Nodes: 4, Start: hour.Add(-30 * time.Minute), Span: 2 * time.Hour})
	var tenants []string
	for _, f := range recs {
		if f.TenantID != schemas.UnknownTenant && !slices.Contains(tenants, f.TenantID) {
			tenants = append(tenants, f.TenantID)
		}
	}
	slices.Sort(tenants)
	return recs, tenants
}

// commit writes recs through the real collector Parquet sink into output
// (a directory, or s3:// through remote) and returns the collector output.
func commit(t *testing.T, recs []schemas.Flow, output string, remote parquet.Remote) {
	t.Helper()
	cfg := parquet.DefaultConfig()
	cfg.Output, cfg.Writer = output, "c1"
	if remote != nil {
		cfg.StagingDir = t.TempDir()
	}
	committest.Flows(t, recs, cfg, parquet.Options{Node: "c1", Logger: quiet, Remote: remote})
}

// want is a project's records of the hour, computed from the Go structs
// (not by the code under test): the identity of each row and the sums.
type want struct {
	rows           map[string]int // rowKey → count
	bytes, packets int64
	peerOnly       int // records of other projects naming this one as peer
}

func rowKey(port, src, dst string, sport, dport int32, bytes, packets, endUS int64) string {
	return fmt.Sprint(port, src, dst, sport, dport, bytes, packets, endUS)
}

func expected(recs []schemas.Flow, project string) want {
	w := want{rows: map[string]int{}}
	for _, f := range recs {
		if f.TimeEnd < hour.UnixMicro() || f.TimeEnd >= hour.Add(time.Hour).UnixMicro() {
			continue
		}
		if f.TenantID != project {
			if f.PeerTenantID == project {
				w.peerOnly++
			}
			continue
		}
		w.rows[rowKey(f.PortID, f.SrcIP, f.DstIP, f.SrcPort, f.DstPort, f.Bytes, f.Packets, f.TimeEnd)]++
		w.bytes += f.Bytes
		w.packets += f.Packets
	}
	return w
}

// layout is one way to give projects their own location.
type layout struct {
	name     string
	location string // billing.flow_logs.location
	source   string // "local" or "s3": where the collector output is
	// setup creates the buckets and policies: projects get read access to
	// their own location only, the delivering account write access.
	setup func(t *testing.T, srv *versitygw.Server, users map[string]string)
}

const deliveryKey = "tapflow-delivery"

func policy(statements ...string) string {
	return `{"Version":"2012-10-17","Statement":[` + strings.Join(statements, ",") + `]}`
}

func allow(principal string, actions []string, resources []string, condition string) string {
	q := func(v []string) string { return `["` + strings.Join(v, `","`) + `"]` }
	s := `{"Effect":"Allow","Principal":{"AWS":["` + principal + `"]},"Action":` + q(actions) + `,"Resource":` + q(resources)
	if condition != "" {
		s += `,"Condition":` + condition
	}
	return s + "}"
}

var layouts = []layout{
	{
		name: "bucket per project", location: "s3://flowlogs-{project_id}/tapflow", source: "local",
		setup: func(t *testing.T, srv *versitygw.Server, users map[string]string) {
			for project, access := range users {
				b := "flowlogs-" + project
				srv.MakeBucket(t, b)
				srv.PutBucketPolicy(t, b, policy(
					allow(access, []string{"s3:ListBucket", "s3:GetObject"}, []string{"arn:aws:s3:::" + b, "arn:aws:s3:::" + b + "/*"}, ""),
					allow(deliveryKey, []string{"s3:PutObject", "s3:AbortMultipartUpload"}, []string{"arn:aws:s3:::" + b + "/tapflow/*"}, "")))
			}
		},
	},
	{
		name: "prefix per project in one bucket", location: "s3://tenant-logs/{project_id}", source: "s3",
		setup: func(t *testing.T, srv *versitygw.Server, users map[string]string) {
			srv.MakeBucket(t, "tenant-logs")
			st := []string{allow(deliveryKey, []string{"s3:PutObject", "s3:AbortMultipartUpload"}, []string{"arn:aws:s3:::tenant-logs/*"}, "")}
			for _, project := range slices.Sorted(maps.Keys(users)) {
				access := users[project]
				st = append(st,
					allow(access, []string{"s3:ListBucket"}, []string{"arn:aws:s3:::tenant-logs"}, `{"StringLike":{"s3:prefix":["`+project+`/*"]}}`),
					allow(access, []string{"s3:GetObject"}, []string{"arn:aws:s3:::tenant-logs/" + project + "/*"}, ""))
			}
			srv.PutBucketPolicy(t, "tenant-logs", policy(st...))
		},
	},
}

// credentialsFile writes an AWS shared-credentials file (0600), as an
// operator gives the delivering process its keys.
func credentialsFile(t testing.TB, access, secret string) string {
	p := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(p, []byte("[default]\naws_access_key_id = "+access+"\naws_secret_access_key = "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// config is the shipped default with the location, the projects, and the
// delivering account's credentials file for the gateway.
func config(t *testing.T, srv *versitygw.Server, location string, projects []string, secret string) Config {
	cfg := DefaultConfig()
	cfg.Location, cfg.Projects, cfg.StagingDir = location, projects, filepath.Join(t.TempDir(), "staging") // made by the first delivery
	cfg.S3.Endpoint, cfg.S3.Region, cfg.S3.PathStyle = srv.Endpoint, versitygw.Region, true
	cfg.S3.CredentialsFile = credentialsFile(t, deliveryKey, secret)
	return cfg
}

func isCode(err error, code string) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == code
}

// TestDeliverTenantAccess delivers one hour of three projects' records to
// two of them on a real S3 server with one account per project and one
// for the delivering process, and checks with each project's own
// credential that it can list and read exactly its records of the hour,
// and is refused the other project's objects. Delivering the hour again
// changes nothing.
func TestDeliverTenantAccess(t *testing.T) {
	recs, tenants := sourceFlows()
	if len(tenants) != 3 {
		t.Fatalf("generated tenants %v, want 3", tenants)
	}
	a, b, c := tenants[0], tenants[1], tenants[2]
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			start := time.Now()
			srv := versitygw.StartWith(t, "", versitygw.Options{IAM: true})
			secret := map[string]string{deliveryKey: "delivery-secret-" + lay.source}
			users := map[string]string{a: "user-a", b: "user-b"}
			for _, access := range users {
				secret[access] = access + "-secret"
			}
			for access, s := range secret {
				srv.CreateUser(t, access, s, "user")
			}
			lay.setup(t, srv, users)

			ctx := context.Background()
			var src *dataset.Output
			var err error
			var putSource func(rel string, body []byte) // a file into the collector output
			switch lay.source {
			case "local":
				dir := t.TempDir()
				commit(t, recs, dir, nil)
				src, err = dataset.Open(ctx, dir, dataset.Options{})
				putSource = func(rel string, body []byte) {
					p := filepath.Join(dir, filepath.FromSlash(rel))
					if err := os.WriteFile(p, body, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			case "s3":
				srv.MakeBucket(t, "lake")
				st, err := s3out.New("s3://lake/tapflow", s3out.DefaultConfig(), s3out.Options{Logger: quiet, Client: srv.Client()})
				if err != nil {
					t.Fatal(err)
				}
				commit(t, recs, "s3://lake/tapflow", st)
				src, err = dataset.Open(ctx, "s3://lake/tapflow", dataset.Options{Client: srv.Client()})
				if err != nil {
					t.Fatal(err)
				}
				putSource = func(rel string, body []byte) {
					if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("lake"), Key: aws.String("tapflow/" + rel), Body: bytes.NewReader(body)}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			d, err := New(config(t, srv, lay.location, []string{a, b}, secret[deliveryKey]), src, Options{Logger: quiet, Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{a, b} { // at 0 before anything happened
				if n := testutil.ToFloat64(d.m.deliveries.WithLabelValues(p)); n != 0 {
					t.Fatalf("deliveries{%s} = %v at start", p, n)
				}
			}
			t0 := time.Now()
			res, err := d.Deliver(ctx, hour)
			if err != nil {
				t.Fatal(err)
			}
			first := time.Since(t0)
			if len(res.Projects) != 2 || res.Projects[0].ID != min(a, b) {
				t.Fatalf("delivered to %+v, want %s and %s", res.Projects, a, b)
			}
			wc := expected(recs, c)
			if res.Skipped[SkipNotListed] != sum(wc.rows) {
				t.Errorf("skipped not_listed = %d, want project %s's %d records", res.Skipped[SkipNotListed], c, sum(wc.rows))
			}

			objects := func() map[string]string {
				out := map[string]string{}
				for _, p := range res.Projects {
					bucket, key, _ := strings.Cut(strings.TrimPrefix(p.URL, "s3://"), "/")
					h, err := srv.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
					if err != nil {
						t.Fatalf("head %s: %v", p.URL, err)
					}
					out[p.URL] = fmt.Sprintf("%s %d", aws.ToString(h.ETag), aws.ToInt64(h.ContentLength))
				}
				return out
			}
			before := objects()

			for i, p := range []string{a, b} {
				other := []string{b, a}[i]
				w := expected(recs, p)
				if w.peerOnly == 0 || len(w.rows) == 0 {
					t.Fatalf("test data: project %s has %d records and is the peer of %d others'", p, len(w.rows), w.peerOnly)
				}
				var got Project
				for _, r := range res.Projects {
					if r.ID == p {
						got = r
					}
				}
				if got.Records != sum(w.rows) || got.Bytes != w.bytes || got.Packets != w.packets {
					t.Errorf("%s: result %d records %d bytes %d packets, want %d %d %d", p, got.Records, got.Bytes, got.Packets, sum(w.rows), w.bytes, w.packets)
				}
				own := srv.ClientAs(users[p], secret[users[p]])
				loc, _ := d.cfg.target(p)
				keys := list(t, own, loc)
				if want := loc.Key(Key(p, hour)); len(keys) != 1 || keys[0] != want {
					t.Fatalf("%s lists %v in its location, want [%s]", p, keys, want)
				}
				body := get(t, own, loc.Bucket, keys[0])
				checkFile(t, p, body, w)

				// The other project's objects: refused.
				oloc, _ := d.cfg.target(other)
				_, err := own.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(oloc.Bucket), Key: aws.String(oloc.Key(Key(other, hour)))})
				if !isCode(err, "AccessDenied") {
					t.Errorf("%s reading %s's object: %v, want AccessDenied", p, other, err)
				}
				_, err = own.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(oloc.Bucket), Prefix: aws.String(oloc.Prefix + "/")})
				if !isCode(err, "AccessDenied") {
					t.Errorf("%s listing %s's location: %v, want AccessDenied", p, other, err)
				}
				t.Logf("%s: lists and reads its %d records (%d bytes, %d B object); refused %s's object and listing (AccessDenied)", p, got.Records, got.Bytes, got.Size, other)
			}

			// Again: the same keys, the same objects.
			if _, err := d.Deliver(ctx, hour); err != nil {
				t.Fatal(err)
			}
			if after := objects(); !maps.Equal(before, after) {
				t.Errorf("second delivery changed the objects:\n before %v\n after  %v", before, after)
			}
			for _, p := range []string{a, b} {
				if n := testutil.ToFloat64(d.m.deliveries.WithLabelValues(p)); n != 2 {
					t.Errorf("deliveries{%s} = %v after two deliveries, want 2", p, n)
				}
			}
			if n := testutil.ToFloat64(d.m.perProject.WithLabelValues(a)); n != 0 {
				t.Errorf("failures{%s} = %v", a, n)
			}
			if n, want := testutil.ToFloat64(d.m.bytes), float64(2*(expected(recs, a).bytes+expected(recs, b).bytes)); n != want {
				t.Errorf("flow bytes delivered = %v, want %v", n, want)
			}

			// A late record of a's for the hour (another collector's file,
			// after the first delivery): delivering the hour again brings it
			// to a's object; b's object stays as it was.
			late := recs[0]
			for _, f := range recs {
				if f.TenantID == a && f.TimeEnd >= hour.UnixMicro() && f.TimeEnd < hour.Add(time.Hour).UnixMicro() {
					late = f
					break
				}
			}
			late.Bytes, late.Packets, late.TimeEnd, late.BatchSeq = 4242, 3, hour.Add(59*time.Minute).UnixMicro(), 1<<40
			var buf bytes.Buffer
			w := pq.NewGenericWriter[schemas.Flow](&buf, pq.KeyValueMetadata(schemas.MetadataKey, schemas.SchemaName))
			if _, err := w.Write([]schemas.Flow{late}); err != nil || w.Close() != nil {
				t.Fatal(err)
			}
			putSource("flows/dt=2026-12-04/hour=05/c2-1-1.parquet", buf.Bytes())
			if _, err := d.Deliver(ctx, hour); err != nil {
				t.Fatal(err)
			}
			corrected := objects()
			withLate := append(slices.Clone(recs), late)
			for _, r := range res.Projects {
				if changed := corrected[r.URL] != before[r.URL]; changed != (r.ID == a) {
					t.Errorf("after the late record %s's object changed: %v", r.ID, changed)
				}
			}
			loc, _ := d.cfg.target(a)
			checkFile(t, a, get(t, srv.ClientAs(users[a], secret[users[a]]), loc.Bucket, loc.Key(Key(a, hour))), expected(withLate, a))

			if left, _ := os.ReadDir(d.cfg.StagingDir); len(left) != 0 {
				t.Errorf("staging_dir keeps %d entries after the deliveries", len(left))
			}
			if st, err := os.Stat(d.cfg.StagingDir); err != nil || st.Mode().Perm()&0o077 != 0 {
				t.Errorf("staging_dir %v is readable by others (it holds every project's records): %v", st.Mode(), err)
			}
			t.Logf("%s: first delivery %s, test %s", lay.name, first.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		})
	}
}

func sum(m map[string]int) int64 {
	var n int64
	for _, v := range m {
		n += int64(v)
	}
	return n
}

func list(t *testing.T, c *s3.Client, loc s3out.Target) []string {
	t.Helper()
	out, err := c.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(loc.Bucket), Prefix: aws.String(loc.Prefix + "/")})
	if err != nil {
		t.Fatalf("list %s as its project: %v", loc, err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

func get(t *testing.T, c *s3.Client, bucket, key string) []byte {
	t.Helper()
	out, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s as its project: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkFile reads a delivered object with parquet-go and checks it holds
// exactly the project's records of the hour with the mapped values.
func checkFile(t *testing.T, project string, body []byte, w want) {
	t.Helper()
	pf, err := pq.OpenFile(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		t.Fatalf("%s: delivered object is not Parquet: %v", project, err)
	}
	if v, _ := pf.Lookup(schemas.MetadataKey); v != SchemaName {
		t.Errorf("%s: metadata %s = %q", project, schemas.MetadataKey, v)
	}
	for _, col := range []string{"version", "account_id", "interface_id", "srcaddr", "dstaddr", "srcport", "dstport", "protocol", "packets", "bytes", "start", "end",
		"instance_id", "tcp_flags", "type", "pkt_srcaddr", "pkt_dstaddr", "flow_direction", "traffic_path", "zone", "external_network", "lb_id"} {
		if _, ok := pf.Schema().Lookup(col); !ok {
			t.Errorf("%s: no column %s", project, col)
		}
	}
	for _, col := range []string{"peer_tenant_id", "peer_mac", "node", "ifname", "agent_id"} {
		if _, ok := pf.Schema().Lookup(col); ok {
			t.Errorf("%s: column %s is delivered; it names what another project or the operator owns", project, col)
		}
	}
	rows := make([]Record, pf.NumRows())
	n, err := pq.NewGenericReader[Record](pf).Read(rows)
	if err != nil && !errors.Is(err, io.EOF) || n != len(rows) {
		t.Fatalf("%s: read %d of %d rows: %v", project, n, len(rows), err)
	}
	got := map[string]int{}
	var bytes, packets int64
	for _, r := range rows {
		got[rowKey(r.InterfaceID, r.SrcAddr, r.DstAddr, r.SrcPort, r.DstPort, r.Bytes, r.Packets, r.TimeEnd)]++
		bytes += r.Bytes
		packets += r.Packets
		if r.AccountID != project || r.Version != 5 || r.LogStatus != "OK" {
			t.Fatalf("%s: row %+v", project, r)
		}
		if r.Start != r.TimeStart/1e6 || r.End != r.TimeEnd/1e6 || r.End < hour.Unix() || r.End >= hour.Add(time.Hour).Unix() {
			t.Fatalf("%s: start/end %d/%d for time_start/time_end %d/%d (hour %d)", project, r.Start, r.End, r.TimeStart, r.TimeEnd, hour.Unix())
		}
		if r.PktSrcAddr != r.SrcAddr || r.PktDstAddr != r.DstAddr || (r.Type != "IPv4" && r.Type != "IPv6") {
			t.Fatalf("%s: addresses/type in %+v", project, r)
		}
		switch {
		case r.FlowDirection == "ingress" && r.TrafficPath == nil:
		case r.FlowDirection == "egress" && r.Zone == "external" && r.TrafficPath != nil && *r.TrafficPath == 2:
		case r.FlowDirection == "egress" && r.Zone == "same_tenant" && r.TrafficPath != nil && *r.TrafficPath == 1:
		case r.FlowDirection == "egress" && r.Zone == "other_tenant" && r.TrafficPath != nil && *r.TrafficPath == 4:
		case r.FlowDirection == "egress" && r.TrafficPath == nil && r.Zone != "external" && r.Zone != "same_tenant" && r.Zone != "other_tenant":
		default:
			t.Fatalf("%s: flow_direction %q zone %q traffic_path %v", project, r.FlowDirection, r.Zone, r.TrafficPath)
		}
	}
	if !maps.Equal(got, w.rows) || bytes != w.bytes || packets != w.packets {
		t.Errorf("%s: object has %d rows, %d bytes, %d packets; want exactly its %d records of the hour, %d bytes, %d packets (source)", project, len(rows), bytes, packets, sum(w.rows), w.bytes, w.packets)
	}
}

// TestDeliverErrors: a project whose bucket is missing, and one whose
// location does not let the delivering account write, fail with an error
// naming the project and the fix, counted; the others are delivered.
func TestDeliverErrors(t *testing.T) {
	recs, tenants := sourceFlows()
	a, b, c := tenants[0], tenants[1], tenants[2]
	srv := versitygw.StartWith(t, "", versitygw.Options{IAM: true})
	srv.CreateUser(t, deliveryKey, "delivery-secret", "user")
	// a: writable; b: a bucket without a grant for the delivering account;
	// c: no bucket at all.
	srv.MakeBucket(t, "flowlogs-"+a)
	srv.PutBucketPolicy(t, "flowlogs-"+a, policy(allow(deliveryKey, []string{"s3:PutObject"}, []string{"arn:aws:s3:::flowlogs-" + a + "/*"}, "")))
	srv.MakeBucket(t, "flowlogs-"+b)
	dir := t.TempDir()
	commit(t, recs, dir, nil)
	src, err := dataset.Open(context.Background(), dir, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(config(t, srv, "s3://flowlogs-{project_id}/tapflow", nil, "delivery-secret"), src, Options{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Deliver(context.Background(), hour)
	if err == nil {
		t.Fatal("delivery to a missing bucket and a denied one succeeded")
	}
	cases := []struct {
		project string
		want    []string // in the error
		failed  bool
	}{
		{a, nil, false},
		{b, []string{"project " + b, "access denied", "grant the delivering credential", "s3:PutObject", "arn:aws:s3:::flowlogs-" + b + "/tapflow/*"}, true},
		{c, []string{"project " + c, "bucket flowlogs-" + c + " does not exist", "create it"}, true},
	}
	for _, tc := range cases {
		var p *Project
		for i := range res.Projects {
			if res.Projects[i].ID == tc.project {
				p = &res.Projects[i]
			}
		}
		if p == nil {
			t.Fatalf("no result for %s in %+v", tc.project, res.Projects)
		}
		if (p.Err != nil) != tc.failed {
			t.Errorf("%s: err %v, want failed=%v", tc.project, p.Err, tc.failed)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(p.Err.Error(), s) || !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not say %q", tc.project, p.Err, s)
			}
		}
		if strings.Contains(err.Error(), "delivery-secret") {
			t.Errorf("error shows the secret: %v", err)
		}
		wantFail := 0.0
		if tc.failed {
			wantFail = 1
		}
		if n := testutil.ToFloat64(d.m.perProject.WithLabelValues(tc.project)); n != wantFail {
			t.Errorf("failures{%s} = %v, want %v", tc.project, n, wantFail)
		}
	}
	if n := testutil.ToFloat64(d.m.failures); n != 2 {
		t.Errorf("delivery failures = %v, want 2", n)
	}
	if n := testutil.ToFloat64(d.m.hoursFail); n != 1 {
		t.Errorf("hours failed = %v, want 1", n)
	}
	t.Logf("errors: %v", err)
}
