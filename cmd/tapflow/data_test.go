package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/tapflow/tapflow/internal/testkit/metered"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
)

// meteredOutput writes a conserved output (flows and meters over three
// hours on 2 nodes × 2 taps × 2 directions, some packets lost) with the
// real Parquet sink.
func meteredOutput(t *testing.T) (string, metered.Data) {
	t.Helper()
	d := metered.Generate(metered.Spec{MeanGap: 2 * time.Second, MeterInterval: 30 * time.Second, Start: time.Date(2026, 12, 1, 22, 40, 0, 0, time.UTC)})
	dir := t.TempDir()
	if err := metered.Write(context.Background(), dir, d, nil); err != nil {
		t.Fatal(err)
	}
	return dir, d
}

// upload copies every committed file of dir to s3://bucket/prefix/ with
// the same relative keys (what the collector's S3 output stores).
func upload(t *testing.T, gw *versitygw.Server, dir, bucket, prefix string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(p, ".parquet") {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = gw.Client().PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(prefix + "/" + filepath.ToSlash(rel)), Body: f})
		n++
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func runTapflow(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestReportAndAuditOnS3 reads the same output from a directory and from
// a real S3 server (versitygw): the reports by day and hour and the meters
// report are identical and match the records, and the audit passes on
// both; with one flow object deleted the S3 audit fails naming the hour.
func TestReportAndAuditOnS3(t *testing.T) {
	dir, data := meteredOutput(t)
	gw := versitygw.Start(t, "")
	gw.MakeBucket(t, "lake")
	if n := upload(t, gw, dir, "lake", "tapflow"); n < 6 {
		t.Fatalf("%d objects uploaded", n)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", versitygw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", versitygw.SecretKey)
	t.Setenv("AWS_REGION", versitygw.Region)
	s3args := []string{"--data", "s3://lake/tapflow", "--s3-endpoint", gw.Endpoint, "--s3-path-style"}

	// Σ bytes per day and tenant, and per hour, node, tap, direction, in Go.
	perDay := map[string]int64{}
	perHourMeter := map[string]int64{}
	for _, f := range data.Flows {
		perDay[time.UnixMicro(f.TimeEnd).UTC().Format("2006-01-02")+","+f.TenantID] += f.Bytes
	}
	for _, m := range data.Meters {
		perHourMeter[time.UnixMicro(m.TimeEnd).UTC().Format("2006-01-02T15Z")+","+m.Node] += m.LostBytes
	}

	tests := []struct {
		name string
		args []string
		want map[string]int64 // csv rows key → value of column col
		col  int
	}{
		{"by day,tenant", []string{"report", "--by", "day,tenant", "--format", "csv"}, perDay, 4},
		{"meters by hour,node", []string{"report", "--meters", "--by", "hour,node", "--format", "csv"}, perHourMeter, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, local, errs := runTapflow(t, append(tc.args, "--data", dir)...)
			if code != exitOK {
				t.Fatalf("local: exit %d: %s", code, errs)
			}
			code, remote, errs := runTapflow(t, append(tc.args, s3args...)...)
			if code != exitOK {
				t.Fatalf("s3: exit %d: %s", code, errs)
			}
			if local != remote {
				t.Fatalf("s3 report differs from the local one:\nlocal:\n%s\ns3:\n%s", local, remote)
			}
			got := map[string]int64{}
			for _, line := range strings.Split(strings.TrimSpace(local), "\n")[1:] {
				f := strings.Split(line, ",")
				v, _ := strconv.ParseInt(f[tc.col], 10, 64)
				got[f[0]+","+f[1]] = v
			}
			if len(got) != len(tc.want) || len(got) < 2 {
				t.Fatalf("%d rows, want %d:\n%s", len(got), len(tc.want), local)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %d, want %d", k, got[k], v)
				}
			}
			t.Logf("tapflow %s:\n%s", strings.Join(tc.args, " "), local)
		})
	}

	code, out, errs := runTapflow(t, append([]string{"audit", "--settle", "0"}, s3args...)...)
	if code != exitOK || !strings.Contains(out, "OK: conserved") {
		t.Fatalf("audit on s3: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("tapflow audit --data s3://lake/tapflow:\n%s", out)
	objs := gw.Objects(t, "lake", "tapflow/flows/dt=2026-12-01/hour=23/")
	for k := range objs {
		if _, err := gw.Client().DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String("lake"), Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
		break
	}
	code, out, _ = runTapflow(t, append([]string{"audit", "--settle", "0"}, s3args...)...)
	if code != exitRuntime || !strings.Contains(out, " hour 2026-12-01T23Z: flows ") || !strings.Contains(out, "FAILED: ") {
		t.Fatalf("audit with a flow object deleted: exit %d\n%s", code, out)
	}
	t.Logf("tapflow audit with a flow object deleted:\n%s", out)
}

// TestAuditCLI: exit codes and messages of tapflow audit on a directory.
func TestAuditCLI(t *testing.T) {
	dir, _ := meteredOutput(t)
	// Data of the last 10 minutes (5 minutes long): newer than the
	// default --settle whatever the time is (now − 15 min, to the hour).
	recentData := metered.Generate(metered.Spec{MeanGap: 2 * time.Second, MeterInterval: 30 * time.Second, Start: time.Now().Add(-10 * time.Minute), Span: 5 * time.Minute})
	recent, removed := t.TempDir(), t.TempDir()
	for _, d := range []string{recent, removed} {
		if err := metered.Write(context.Background(), d, recentData, nil); err != nil {
			t.Fatal(err)
		}
	}
	flowFiles, _ := filepath.Glob(filepath.Join(removed, "flows", "dt=*", "hour=*", "*.parquet"))
	if len(flowFiles) == 0 {
		t.Fatal("no flow file written")
	}
	if err := os.Remove(flowFiles[0]); err != nil {
		t.Fatal(err)
	}
	noMeters := t.TempDir() // flows without meters/: an error naming the cause
	if err := metered.Write(context.Background(), noMeters, recentData, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(noMeters, "meters")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"conserved", []string{"audit", "--data", dir, "--settle", "0"}, exitOK, "OK: conserved"},
		{"every hour", []string{"audit", "--data", dir, "--settle", "0", "--all"}, exitOK, "cmp2  tap201-aa  rx   2026-12-02T00Z"},
		{"one day", []string{"audit", "--data", dir, "--from", "2026-12-01", "--to", "2026-12-02"}, exitOK, "8 node×tap×direction keys, 16 key-hours"},
		{"no meters", []string{"audit", "--data", noMeters, "--settle", "0"}, exitRuntime, "source: ebpf"},
		{"nothing in range", []string{"audit", "--data", dir, "--from", "2026-11-01", "--to", "2026-11-02"}, exitNothingChecked, "NOTHING CHECKED"},
		{"empty directory", []string{"audit", "--data", t.TempDir()}, exitNothingChecked, "NOTHING CHECKED: the output holds no flow.v1 or meter.v1 file"},
		// Right after a run: every hour newer than now − --settle.
		{"all too new", []string{"audit", "--data", recent}, exitNothingChecked, "newer than now − --settle 15m0s"},
		{"all too new, flow file removed", []string{"audit", "--data", removed}, exitNothingChecked, "NOTHING CHECKED"},
		{"settled, flow file removed", []string{"audit", "--data", removed, "--settle", "0"}, exitRuntime, "FAILED: "},
		{"settled, recent", []string{"audit", "--data", recent, "--settle", "0"}, exitOK, "OK: conserved"},
		{"no data", []string{"audit"}, exitUsage, "--data is required"},
		{"bad time", []string{"audit", "--data", dir, "--from", "yesterday"}, exitUsage, "is not a time"},
		{"settled nothing", []string{"audit", "--data", dir, "--from", "2099-01-01"}, exitUsage, "is not before --to"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runTapflow(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errs, tc.contains) {
				t.Fatalf("exit %d (want %d), want %q in:\n%s%s", code, tc.code, tc.contains, out, errs)
			}
		})
	}
}
