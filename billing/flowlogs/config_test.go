package flowlogs

import (
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

// TestConfigValidate: the shipped defaults pass; every bad value is named
// with its key and a fix.
func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string // in the error; "" valid
	}{
		{"defaults (off)", func(*Config) {}, ""},
		{"bucket per project", func(c *Config) { c.Location = "s3://flowlogs-{project_id}/tapflow" }, ""},
		{"prefix per project", func(c *Config) { c.Location = "s3://tenant-logs/{project_id}/" }, ""},
		{"no placeholder", func(c *Config) { c.Location = "s3://tenant-logs/all" }, "location: \"s3://tenant-logs/all\" has no {project_id}"},
		{"not s3", func(c *Config) { c.Location = "/var/lib/flowlogs/{project_id}" }, "not an s3:// URL"},
		{"other placeholder", func(c *Config) { c.Location = "s3://logs/{project}/{project_id}" }, "only {project_id} may be used"},
		{"bad bucket", func(c *Config) { c.Location = "s3://Logs_{project_id}" }, "not a valid S3 bucket name"},
		{"bad project", func(c *Config) { c.Projects = []string{"Admin/1"} }, "projects: \"Admin/1\" is not a project ID"},
		{"compression", func(c *Config) { c.Compression = "gzip" }, "compression: \"gzip\" is unknown"},
		{"row groups", func(c *Config) { c.RowGroupRows = 10 }, "row_group_rows: 10 is outside"},
		{"s3 section", func(c *Config) { c.S3.Endpoint = "ftp://x" }, "s3.endpoint"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestTargetAndKey: a project's location and object key.
func TestTargetAndKey(t *testing.T) {
	h := time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)
	p := "3f2a0e1b9c8d4e5fa0b1c2d3e4f5a6b7"
	for _, tc := range []struct{ location, bucket, key string }{
		{"s3://flowlogs-{project_id}/tapflow", "flowlogs-" + p, "tapflow/year=2026/month=12/day=04/hour=05/" + p + "_tapflow_20261204T0500Z.parquet"},
		{"s3://tenant-logs/{project_id}/", "tenant-logs", p + "/year=2026/month=12/day=04/hour=05/" + p + "_tapflow_20261204T0500Z.parquet"},
		{"s3://flowlogs-{project_id}", "flowlogs-" + p, "year=2026/month=12/day=04/hour=05/" + p + "_tapflow_20261204T0500Z.parquet"},
	} {
		c := DefaultConfig()
		c.Location = tc.location
		tg, err := c.target(p)
		if err != nil {
			t.Fatal(err)
		}
		if tg.Bucket != tc.bucket || tg.Key(Key(p, h)) != tc.key {
			t.Errorf("%s: s3://%s/%s, want s3://%s/%s", tc.location, tg.Bucket, tg.Key(Key(p, h)), tc.bucket, tc.key)
		}
	}
	c := DefaultConfig()
	c.Location = "s3://flowlogs-{project_id}"
	if _, err := c.target("unknown/../x"); err == nil {
		t.Error("a project ID with '/' made a location")
	}
}

// TestToRecord: the mapping of the fields whose values change.
func TestToRecord(t *testing.T) {
	base := schemas.Flow{TimeStart: 1_764_824_400_999_999, TimeEnd: 1_764_824_401_000_000, Direction: "tx", IPVersion: 6, Zone: "external",
		TenantID: "a", PortID: "port", ServerID: "vm", SrcIP: "2001:db8::1", DstIP: "2001:db8::2", Bytes: 1514, Packets: 1}
	cases := []struct {
		name  string
		edit  func(*schemas.Flow)
		check func(Record) bool
	}{
		{"seconds floored", func(*schemas.Flow) {}, func(r Record) bool {
			return r.Start == 1_764_824_400 && r.End == 1_764_824_401 && r.TimeEnd == 1_764_824_401_000_000
		}},
		{"ids and addresses", func(*schemas.Flow) {}, func(r Record) bool {
			return r.AccountID == "a" && r.InterfaceID == "port" && r.InstanceID == "vm" && r.Type == "IPv6" && r.PktSrcAddr == "2001:db8::1" && r.SrcAddr == r.PktSrcAddr && r.Bytes == 1514
		}},
		{"egress external", func(*schemas.Flow) {}, func(r Record) bool { return r.FlowDirection == "egress" && *r.TrafficPath == 2 }},
		{"egress same tenant", func(f *schemas.Flow) { f.Zone = "same_tenant" }, func(r Record) bool { return *r.TrafficPath == 1 }},
		{"egress other tenant", func(f *schemas.Flow) { f.Zone = "other_tenant" }, func(r Record) bool { return *r.TrafficPath == 4 }},
		{"egress infra", func(f *schemas.Flow) { f.Zone = "infra" }, func(r Record) bool { return r.TrafficPath == nil }},
		{"ingress", func(f *schemas.Flow) { f.Direction = "rx" }, func(r Record) bool { return r.FlowDirection == "ingress" && r.TrafficPath == nil }},
		{"member copy of another project's LB", func(f *schemas.Flow) {
			f.LBID, f.LBTap, f.PoolID, f.MemberID, f.PeerTenantID, f.LBSegment = "lb", schemas.LBTapMember, "pool", "m", "b", 2
		}, func(r Record) bool {
			return r.LBID == "" && r.PoolID == "" && r.MemberID == "" && r.LBTap == "member" && r.LBSegment == 2
		}},
		{"member copy of its own LB", func(f *schemas.Flow) {
			f.LBID, f.LBTap, f.PoolID, f.MemberID, f.PeerTenantID = "lb", schemas.LBTapMember, "pool", "m", "a"
		}, func(r Record) bool { return r.LBID == "lb" && r.PoolID == "pool" && r.MemberID == "m" }},
		{"amphora", func(f *schemas.Flow) { f.LBID, f.LBTap = "lb", schemas.LBTapAmphora }, func(r Record) bool { return r.LBID == "lb" }},
	}
	for _, tc := range cases {
		f := base
		tc.edit(&f)
		if r := toRecord(&f); !tc.check(r) || r.Version != 5 || r.LogStatus != "OK" {
			t.Errorf("%s: %+v", tc.name, r)
		}
	}
}
