package transport_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/transport"
)

// oldServer is a stand-in for a nats-server older than tapflow supports:
// it speaks just enough of the NATS client protocol (INFO with the given
// version, PONG to every PING, +OK nothing else) for nats.go to complete
// a connection. No real pre-2.9.10 server can be installed here (Debian
// 12 ships 2.9.10, the minimum itself), so this covers only the refusal
// path; every other test runs real servers.
func oldServer(t *testing.T, version string) string {
	t.Helper()
	return oldServerOn(t, "127.0.0.1:0", version)
}

func oldServerOn(t *testing.T, addr, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "INFO {\"server_id\":\"OLD\",\"server_name\":\"old\",\"version\":%q,\"proto\":1,\"go\":\"go1.19\",\"host\":\"127.0.0.1\",\"port\":4222,\"headers\":true,\"max_payload\":1048576,\"jetstream\":true}\r\n", version)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						fmt.Fprint(c, "PONG\r\n")
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

// TestOldServerRefused: Connect and ConnectBackground refuse a server
// older than transport.MinServerVersion at once (no retrying), naming its
// version and the minimum; a server that reports a version of the
// minimum or later is accepted.
func TestOldServerRefused(t *testing.T) {
	for _, tc := range []struct {
		version string
		refused bool
	}{
		{"2.8.4", true},
		{"2.9.9", true},
		{"1.4.1", true},
		{"2.9.10", false},
		{"2.10.0-beta.5", false},
		{"2.15.2", false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			cfg := transport.DefaultConfig()
			cfg.URL = oldServer(t, tc.version)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			log := slog.New(slog.DiscardHandler)
			connects := map[string]func() error{
				"Connect": func() error {
					nc, err := transport.Connect(ctx, cfg, "test", log)
					if err == nil {
						nc.Close()
					}
					return err
				},
				"ConnectBackground": func() error {
					nc, err := transport.ConnectBackground(cfg, "test", log, func(error) {})
					if err == nil {
						nc.Close()
					}
					return err
				},
			}
			for name, connect := range connects {
				start := time.Now()
				err := connect()
				took := time.Since(start)
				if !tc.refused {
					if err != nil {
						t.Errorf("%s: %s refused: %v", name, tc.version, err)
					}
					continue
				}
				if !errors.Is(err, transport.ErrServerTooOld) {
					t.Fatalf("%s: err %v, want ErrServerTooOld", name, err)
				}
				if took > 5*time.Second {
					t.Errorf("%s: refusal took %s", name, took)
				}
				for _, w := range []string{"version " + tc.version, transport.MinServerVersion + " or later", "upgrade"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error lacks %q: %v", name, w, err)
					}
				}
			}
		})
	}
}

// TestOldServerRefusedInBackground: an agent started before its NATS
// answers (ConnectBackground) stops with ErrServerTooOld once an old
// server appears on the address, within seconds.
func TestOldServerRefusedInBackground(t *testing.T) {
	addr := freeAddr(t)
	cfg := transport.DefaultConfig()
	cfg.URL = "nats://" + addr
	fatal := make(chan error, 1)
	nc, err := transport.ConnectBackground(cfg, "agent", slog.New(slog.DiscardHandler), func(err error) { fatal <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	oldServerOn(t, addr, "2.8.4")
	select {
	case err := <-fatal:
		if !errors.Is(err, transport.ErrServerTooOld) || !strings.Contains(err.Error(), "2.8.4") {
			t.Fatalf("fatal: %v, want ErrServerTooOld naming 2.8.4", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no fatal error 15 s after an old server appeared")
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v, min string
		want   bool
		err    bool
	}{
		{"2.9.10", "2.9.10", true, false},
		{"v2.9.10", "2.9.10", true, false},
		{"2.9.9", "2.9.10", false, false},
		{"2.10.0", "2.9.10", true, false},
		{"2.10.4-RC.1", "2.10.4", true, false},
		{"3.0.0", "2.10.4", true, false},
		{"2.9", "2.9.10", false, true},
		{"", "2.9.10", false, true},
	} {
		got, err := transport.VersionAtLeast(tc.v, tc.min)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("versionAtLeast(%q, %q) = %v, %v; want %v, err %v", tc.v, tc.min, got, err, tc.want, tc.err)
		}
	}
}

// FuzzVersionAtLeast: whatever a server reports as its version (the INFO
// line is the server's to write), the check neither panics nor accepts
// what it cannot read, and it is a total order on what it can:
// reflexive, and a ≥ b with b ≥ a only for the same major.minor.patch.
func FuzzVersionAtLeast(f *testing.F) {
	for _, s := range [][2]string{
		{"2.9.10", "2.9.10"}, {"v2.10.4", "2.9.10"}, {"2.10.0-beta.3", "2.10.0"}, {"2.9.10+debian", "2.9.9"},
		{"", "2.9.10"}, {"2.9", "2.9.10"}, {"2.9.-1", "1.0.0"}, {"99999999999999999999.0.0", "2.9.10"}, {" 2.9.10 ", "2.9.10"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, errA := transport.VersionAtLeast(a, b)
		ba, errB := transport.VersionAtLeast(b, a)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("VersionAtLeast(%q, %q) err %v, reversed err %v: one of them cannot be read either way", a, b, errA, errB)
		}
		if errA != nil {
			if ab || ba {
				t.Fatalf("VersionAtLeast(%q, %q) = %v, %v with an error: an unreadable version must not pass", a, b, ab, ba)
			}
			return
		}
		if !ab && !ba {
			t.Fatalf("%q and %q: neither is at least the other", a, b)
		}
		if aa, err := transport.VersionAtLeast(a, a); err != nil || !aa {
			t.Fatalf("VersionAtLeast(%q, itself) = %v, %v", a, aa, err)
		}
	})
}
