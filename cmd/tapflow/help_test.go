package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/version"
)

// commandPaths lists every command and subcommand, hidden ones (lab
// serve|send parse their own flags) and cobra's completion aside.
func commandPaths() [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		out = append(out, path)
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "completion" || sub.Name() == "help" {
				continue
			}
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(newRoot(), nil)
	return out
}

// TestHelpEverywhere: --help, -h and `tapflow help CMD` on every command
// and subcommand exit 0 and print that command's usage on stdout; not the
// version, not an error, nothing on stderr, and no side effect (spool
// inspect --help used to read --help as the spool directory).
func TestHelpEverywhere(t *testing.T) {
	paths := commandPaths()
	if len(paths) < 25 {
		t.Fatalf("only %d commands found: %v", len(paths), paths)
	}
	for _, p := range paths {
		for _, form := range [][]string{
			append(append([]string(nil), p...), "--help"),
			append(append([]string(nil), p...), "-h"),
			append([]string{"help"}, p...),
		} {
			t.Run(strings.Join(form, " "), func(t *testing.T) {
				dir := t.TempDir()
				t.Chdir(dir)
				var out, errb bytes.Buffer
				code := run(form, &out, &errb)
				if code != exitOK || errb.Len() > 0 {
					t.Fatalf("exit %d, stderr %q", code, errb.String())
				}
				usage := "Usage:\n  " + strings.Join(append([]string{"tapflow"}, p...), " ")
				if !strings.Contains(out.String(), usage) || !strings.Contains(out.String(), "--help") {
					t.Fatalf("stdout lacks %q:\n%s", usage, out.String())
				}
				if strings.TrimSpace(out.String()) == "tapflow "+version.Version {
					t.Fatalf("printed the version")
				}
				if ents, _ := os.ReadDir(dir); len(ents) > 0 {
					t.Fatalf("help created %v", ents)
				}
			})
		}
	}
}

// TestUsageErrors: a parent without its subcommand, an unknown
// subcommand, an unknown flag and a missing argument exit 2 with the
// problem and the way to the help on stderr.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"spool"}, []string{"Usage:\n  tapflow spool inspect|verify|repair DIR"}},
		{[]string{"spool", "inspect"}, []string{"give the spool directory", "tapflow spool inspect --help"}},
		{[]string{"spool", "inspect", "a", "b"}, []string{"give the spool directory"}},
		{[]string{"inventory"}, []string{"tapflow inventory dump|confirm|serve"}},
		{[]string{"inventory", "list"}, []string{`unknown command "list"; use confirm|dump|serve`}},
		{[]string{"lab"}, []string{"tapflow lab <command>"}},
		{[]string{"lab", "fly"}, []string{`unknown command "fly"`}},
		{[]string{"spool", "inpsect", "d"}, []string{`unknown command "inpsect" (did you mean inspect?)`}},
		{[]string{"reprot"}, []string{`unknown command "reprot" for "tapflow"`, "Did you mean this?\n\treport"}},
		{[]string{"lab", "up"}, []string{"give one topology"}},
		{[]string{"lab", "inventory", "add"}, []string{"give add|remove SERVER"}},
		{[]string{"version", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"validate"}, []string{"give one config file"}},
		{[]string{"tap", "--frobnicate"}, []string{"unknown flag: --frobnicate", "tapflow tap --help"}},
		{[]string{"run", "-config", "x"}, []string{"unknown shorthand flag", "two dashes"}},
		{[]string{"agent", "--output", "/tmp/x"}, []string{"unknown flag: --output"}}, // the agent writes no Parquet
		{[]string{"report", "--data"}, []string{"flag needs an argument: --data"}},
		{[]string{"agent", "--log-level", "loud"}, []string{`--log-level "loud": use debug, info, warn, error`}},
		{[]string{"collector", "--log-format", "xml"}, []string{`--log-format "xml": use json or text`}},
		{[]string{"tap", "--log-level", "debug"}, []string{"unknown flag: --log-level"}}, // tap serves no logs
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, &out, &errb); code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", code, exitUsage, errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
		})
	}
}

// TestObsFlags: --log-level, --log-format and --metrics-listen override
// the config file. The config's metrics address is taken by the test, so
// an agent that uses it fails right after its first log line, naming it.
func TestObsFlags(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	busy := ln.Addr().String()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tapflow.yaml")
	if err := os.WriteFile(cfg, []byte("node: n1\nlog:\n  format: json\n  level: info\nmetrics:\n  listen: "+busy+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		want, not []string
	}{
		{"config values", []string{"--data-dir", dir}, exitRuntime, []string{`"msg":"tapflow starting"`, "metrics listen " + busy}, []string{"level=INFO"}},
		{"text format, other address", []string{"--data-dir", dir, "--log-format", "text", "--metrics-listen", "127.0.0.1:0"}, exitOK,
			[]string{`level=INFO msg="tapflow starting"`}, []string{`"msg"`, "metrics listen"}},
		{"error level", []string{"--data-dir", dir, "--log-level", "error"}, exitRuntime,
			[]string{`"level":"ERROR"`, "metrics listen " + busy}, []string{"tapflow starting"}},
		{"metrics disabled", []string{"--data-dir", dir, "--metrics-listen", "", "--log-level", "debug"}, exitOK,
			[]string{`"msg":"tapflow starting"`}, []string{"metrics listen"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"agent", "--config", cfg, "--duration", "300ms"}, tc.args...)
			if code := run(args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
			for _, n := range tc.not {
				if strings.Contains(errb.String(), n) {
					t.Errorf("stderr has %q:\n%s", n, errb.String())
				}
			}
		})
	}
}
