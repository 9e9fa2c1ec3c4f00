package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/transport/publish/spool"
)

// makeSpool writes n entries into a fresh spool and closes it.
func makeSpool(t *testing.T, dir string, n int) string {
	t.Helper()
	cfg := spool.DefaultConfig()
	cfg.Dir = dir
	s, err := spool.New(cfg, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e := &spool.Entry{Seq: int64(100 + i), Created: time.Now(), Records: 10, MsgID: "a-1", Subject: "tapflow.flows.v1.x", Body: bytes.Repeat([]byte{1}, 1000)}
		if err := s.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	return segs[0]
}

func TestSpoolCLI(t *testing.T) {
	type step struct {
		args     []string
		code     int
		out, err []string
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, seg string)
		steps  []step
	}{
		{"clean spool", nil, []step{
			{[]string{"inspect"}, exitOK, []string{"pending: 5 batches, 50 records", "not in use", "100", "104"}, nil},
			{[]string{"verify"}, exitOK, []string{"verify: ok"}, nil},
			{[]string{"repair"}, exitOK, []string{"repair: nothing to do"}, nil},
		}},
		{"torn tail", func(t *testing.T, seg string) {
			st, _ := os.Stat(seg)
			if err := os.Truncate(seg, st.Size()-300); err != nil {
				t.Fatal(err)
			}
		}, []step{
			{[]string{"inspect"}, exitOK, []string{"PROBLEM: torn tail", "1 problem(s) found"}, nil},
			{[]string{"verify"}, exitRuntime, []string{"torn tail"}, nil},
			{[]string{"repair"}, exitOK, []string{"repaired:", "torn tail of", "pending: 4 batches"}, nil},
			{[]string{"verify"}, exitOK, []string{"verify: ok"}, nil},
		}},
		{"corrupt middle", func(t *testing.T, seg string) {
			b, _ := os.ReadFile(seg)
			b[8+1100*2+500] ^= 0x55 // inside the third entry's body
			_ = os.WriteFile(seg, b, 0o640)
		}, []step{
			{[]string{"verify"}, exitRuntime, []string{"PROBLEM: corrupt", "checksum mismatch"}, nil},
			{[]string{"repair"}, exitOK, []string{"rewritten without 1 corrupt stretch", "pending: 4 batches"}, nil},
			{[]string{"verify"}, exitOK, []string{"verify: ok"}, nil},
		}},
		{"usage", nil, []step{
			{nil, exitUsage, nil, []string{"tapflow spool inspect|verify|repair DIR"}},
			{[]string{"fix"}, exitUsage, nil, []string{`unknown command "fix"; use inspect|repair|verify`}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			seg := makeSpool(t, dir, 5)
			if tc.damage != nil {
				tc.damage(t, seg)
			}
			for _, st := range tc.steps {
				args := st.args
				if len(args) == 1 {
					args = append(args, dir)
				}
				var out, errb bytes.Buffer
				if code := run(append([]string{"spool"}, args...), &out, &errb); code != st.code {
					t.Fatalf("spool %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, st.code, out.String(), errb.String())
				}
				for _, s := range st.out {
					if !strings.Contains(out.String(), s) {
						t.Errorf("spool %v: stdout lacks %q:\n%s", args, s, out.String())
					}
				}
				for _, s := range st.err {
					if !strings.Contains(errb.String(), s) {
						t.Errorf("spool %v: stderr lacks %q:\n%s", args, s, errb.String())
					}
				}
			}
		})
	}
	t.Run("missing dir", func(t *testing.T) {
		var out, errb bytes.Buffer
		if code := run([]string{"spool", "inspect", filepath.Join(t.TempDir(), "nope")}, &out, &errb); code != exitRuntime || !strings.Contains(errb.String(), "agent.spool.dir") {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
	})
}
