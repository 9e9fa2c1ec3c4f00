package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// TestSIGHUPKeepsDaemonsRunning: SIGHUP (a terminal hangup, `systemctl
// reload`) reaches the collector and `inventory serve`, each a real child
// process, while they still wait for NATS, before any stream, consumer or
// bucket exists. Go's default would kill them; each logs that it has
// nothing to reload and keeps running. Once NATS comes up each does its
// job (the collector commits a published batch to Parquet; inventory
// serve publishes the snapshot of its file), a second SIGHUP is logged
// the same way, and SIGTERM still stops it cleanly (exit 0).
func TestSIGHUPKeepsDaemonsRunning(t *testing.T) {
	tests := []struct {
		name, command string
		args          []string
		config        string // appended to the common config; %[1]s is the test's dir
		job           func(t *testing.T, s *transporttest.Server, dir string)
	}{
		{
			name: "collector", command: "collector", args: []string{"collector"},
			config: "collector:\n  output: %[1]s/out\n  roll_age: 1s\n",
			job: func(t *testing.T, s *transporttest.Server, dir string) {
				waitFor(t, "the collector's durable consumer", func() bool {
					_, err := s.JS.Consumer(context.Background(), "TAPFLOW_FLOWS", "tapflow-collector")
					return err == nil
				})
				publishFlows(t, s, t.TempDir(), 100, time.Now())
				var rows []schemas.Flow
				waitFor(t, "100 rows in committed Parquet files", func() bool {
					rows = parquetRows(t, filepath.Join(dir, "out", "flows"))
					return len(rows) >= 100
				})
				if len(rows) != 100 {
					t.Errorf("%d rows in Parquet, want the 100 published", len(rows))
				}
			},
		},
		{
			name: "inventory serve", command: "inventory serve", args: []string{"inventory", "serve"},
			config: "inventory:\n  provider: file\n  file: %[1]s/inventory.yaml\n  poll_interval: 1s\n",
			job: func(t *testing.T, s *transporttest.Server, _ string) {
				var ports int
				waitFor(t, "the inventory snapshot in "+transport.InventoryBucket, func() bool {
					obs, err := s.JS.ObjectStore(context.Background(), transport.InventoryBucket)
					if err != nil {
						return false
					}
					data, err := obs.GetBytes(context.Background(), transport.InventoryObject)
					if err != nil {
						return false
					}
					inv, err := natsinv.Decode(data)
					if err != nil {
						t.Fatalf("published snapshot: %v", err)
					}
					ports = len(inv.Ports)
					return true
				})
				if ports != 2 {
					t.Errorf("snapshot has %d ports, want the file's 2", ports)
				}
			},
		},
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			addr := freeAddr(t)
			vms := []*nslab.VM{
				{Name: "vm1", IP: net.IPv4(10, 213, 7, 1), MAC: net.HardwareAddr{0xfa, 0x16, 0x3e, 0, 0, 1}},
				{Name: "vm2", IP: net.IPv4(10, 213, 7, 2), MAC: net.HardwareAddr{0xfa, 0x16, 0x3e, 0, 0, 2}},
			}
			writeFile(t, filepath.Join(dir, "inventory.yaml"), nslab.Inventory("5d1b6f1e9c4a4f0e8f0f7a1b2c3d4e5f", vms...))
			cfg := fmt.Sprintf("node: hup1\ndata_dir: %[1]s/data\nnats:\n  url: nats://"+addr+"\nlog:\n  format: json\n  level: info\nmetrics:\n  listen: \"\"\n"+tc.config, dir)
			writeFile(t, filepath.Join(dir, "tapflow.yaml"), cfg)
			logPath := filepath.Join(dir, "log.json")
			logf, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer logf.Close()

			cmd := exec.Command(self, append(tc.args, "--config", filepath.Join(dir, "tapflow.yaml"))...)
			cmd.Env = append(os.Environ(), "TAPFLOW_TEST_MAIN=1")
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					<-exited
				}
			})
			alive := func(when string) {
				t.Helper()
				select {
				case err := <-exited:
					exited <- err
					b, _ := os.ReadFile(logPath)
					t.Fatalf("%s exited (%v) %s:\n%s", tc.name, err, when, b)
				default:
				}
			}
			logged := func(msg string, n int) {
				t.Helper()
				waitFor(t, fmt.Sprintf("%d× %q in the log", n, msg), func() bool {
					alive("before " + msg)
					b, _ := os.ReadFile(logPath)
					return strings.Count(string(b), `"msg":"`+msg+`"`) >= n
				})
			}

			// Waiting for NATS: nothing exists yet.
			logged("NATS unreachable; retrying (nothing to consume until it answers)", 1)
			hup := "SIGHUP: nothing to reload for " + tc.command
			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			logged(hup, 1)
			time.Sleep(200 * time.Millisecond)
			alive("after SIGHUP")

			s := transporttest.Listen(t, "", addr)
			tc.job(t, s, dir)

			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			logged(hup, 2)
			alive("after the second SIGHUP")
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					b, _ := os.ReadFile(logPath)
					t.Fatalf("stop at SIGTERM: %v\n%s", err, b)
				}
			case <-time.After(time.Minute):
				t.Fatal("no exit within 1m of SIGTERM")
			}
		})
	}
}

// waitFor polls cond until it holds, failing after 60 s (a loaded box).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 60s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// parquetRows reads every committed Parquet file under dir (none yet: nil).
func parquetRows(t *testing.T, dir string) []schemas.Flow {
	t.Helper()
	var all []schemas.Flow
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".parquet") || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		rows, err := pq.ReadFile[schemas.Flow](p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		all = append(all, rows...)
		return nil
	})
	return all
}
