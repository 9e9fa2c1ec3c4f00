package spool

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
)

var quiet = slog.New(slog.DiscardHandler)

func testCfg(dir string) Config {
	c := DefaultConfig()
	c.Dir = dir
	c.MaxBytes = 64 << 20
	c.SegmentBytes = 256 << 10
	return c
}

func open(t testing.TB, cfg Config) *Spool {
	t.Helper()
	s, err := New(cfg, Options{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func entry(seq int64, size int) *Entry {
	body := bytes.Repeat([]byte{byte(seq)}, size)
	return &Entry{Seq: seq, Created: time.UnixMicro(1_700_000_000_000_000 + seq), Records: int(seq % 100), MsgID: fmt.Sprintf("agent-a-%d", seq), Subject: "tapflow.flows.v1.cmp1", Body: body}
}

func appendN(t testing.TB, s *Spool, from, n int64, size int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if err := s.Append(entry(i, size)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

// drain replays every entry and returns their seqs, checking bodies.
func drain(t testing.TB, s *Spool) []int64 {
	t.Helper()
	var seqs []int64
	for {
		e, ok, err := s.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return seqs
		}
		want := entry(e.Seq, len(e.Body))
		if e.MsgID != want.MsgID || e.Subject != want.Subject || e.Records != want.Records || !bytes.Equal(e.Body, want.Body) || !e.Created.Equal(want.Created) {
			t.Fatalf("entry %d differs from what was appended", e.Seq)
		}
		seqs = append(seqs, e.Seq)
		if err := s.Advance(); err != nil {
			t.Fatal(err)
		}
	}
}

func seqRange(from, n int64) []int64 {
	var v []int64
	for i := from; i < from+n; i++ {
		v = append(v, i)
	}
	return v
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReplayOrderAcrossRestartsAndSegments(t *testing.T) {
	dir := t.TempDir()
	cfg := testCfg(dir)
	s := open(t, cfg)
	appendN(t, s, 1, 100, 10_000) // ~1 MB over ~4 segments
	// consume 30, then "restart"
	for range 30 {
		if _, ok, err := s.Peek(); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Advance(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, cfg)
	if n, _ := s2.Pending(); n != 70 {
		t.Fatalf("pending after reopen = %d, want 70", n)
	}
	appendN(t, s2, 101, 20, 10_000)
	if got := drain(t, s2); !equal(got, seqRange(31, 90)) {
		t.Fatalf("replayed %v, want 31..120 in order", got)
	}
	segs, _ := listSegments(dir)
	if len(segs) != 1 {
		t.Fatalf("%d segments left after a full drain, want only the append segment", len(segs))
	}
	if !s2.Empty() {
		t.Fatal("not empty after drain")
	}
}

// TestTornTail cuts the last frame at several points (as kill -9 mid-append
// would) and checks that the spool truncates it, counts it and goes on.
func TestTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  int64 // bytes removed from the end of the segment
	}{
		{"inside header", frameHdrLen + fixedPayload + 8 + 21 + 5000 - 3},
		{"inside body", 1000},
		{"one byte", 1},
		{"only header left", 5000 + fixedPayload + 8 + 21},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testCfg(dir)
			cfg.SegmentBytes = 1 << 20
			s := open(t, cfg)
			appendN(t, s, 1, 10, 5000)
			_ = s.Close()
			segs, _ := listSegments(dir)
			p := segPath(dir, segs[len(segs)-1].id)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-tc.cut); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Problems() != 1 || !rep.Segments[len(rep.Segments)-1].Problems[0].Torn {
				t.Fatalf("verify: %d problems %+v, want one torn tail", rep.Problems(), rep.Segments)
			}
			s2 := open(t, cfg)
			if got := testutil.ToFloat64(s2.m.TornTails); got != 1 {
				t.Fatalf("torn tails counted %v, want 1", got)
			}
			appendN(t, s2, 11, 2, 5000)
			if got := drain(t, s2); !equal(got, append(seqRange(1, 9), 11, 12)) {
				t.Fatalf("replayed %v, want 1..9,11,12", got)
			}
		})
	}
}

// TestCorruptionInsideSegment flips bytes in the middle of a sealed segment:
// replay skips exactly the damaged entries, verify reports them and repair
// removes them so verify is clean afterwards.
func TestCorruptionInsideSegment(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(b []byte, frameOff func(i int) int64)
		lostSeq []int64
	}{
		{"body bit flip", func(b []byte, fo func(int) int64) { b[fo(3)+200] ^= 0xff }, []int64{4}},
		{"magic destroyed", func(b []byte, fo func(int) int64) { copy(b[fo(5):], "XXXX") }, []int64{6}},
		{"length garbage", func(b []byte, fo func(int) int64) { copy(b[fo(2)+4:], []byte{0xff, 0xff, 0xff, 0x7f}) }, []int64{3}},
		{"zeroed stretch over two frames", func(b []byte, fo func(int) int64) { clear(b[fo(6)+100 : fo(7)+100]) }, []int64{7, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testCfg(dir)
			cfg.SegmentBytes = 1 << 20
			s := open(t, cfg)
			appendN(t, s, 1, 10, 3000)
			_ = s.Close()
			segs, _ := listSegments(dir)
			p := segPath(dir, segs[0].id)
			b, _ := os.ReadFile(p)
			size := entry(1, 3000).frameSize()
			tc.damage(b, func(i int) int64 { return int64(len(segHeader)) + int64(i)*size })
			if err := os.WriteFile(p, b, 0o640); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Problems() == 0 {
				t.Fatal("verify found no problem")
			}
			want := []int64{}
			for i := int64(1); i <= 10; i++ {
				if !contains(tc.lostSeq, i) {
					want = append(want, i)
				}
			}
			// Replay skips the damage (on a copy, so repair sees it too).
			cp := t.TempDir()
			copyDir(t, dir, cp)
			s2 := open(t, testCfg(cp))
			if got := drain(t, s2); !equal(got, want) {
				t.Fatalf("replay after damage: %v, want %v", got, want)
			}
			if testutil.ToFloat64(s2.m.CorruptBytes) == 0 {
				t.Fatal("corrupt bytes not counted")
			}
			// Repair, then verify is clean and replay gives the same.
			rep, err = Repair(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Problems() != 0 || len(rep.Repaired) == 0 {
				t.Fatalf("after repair: %d problems, changes %v", rep.Problems(), rep.Repaired)
			}
			if rep.Pending != int64(len(want)) {
				t.Fatalf("after repair pending %d, want %d", rep.Pending, len(want))
			}
			s3 := open(t, testCfg(dir))
			if got := drain(t, s3); !equal(got, want) {
				t.Fatalf("replay after repair: %v, want %v", got, want)
			}
		})
	}
}

func contains(v []int64, x int64) bool {
	for _, y := range v {
		if y == x {
			return true
		}
	}
	return false
}

func copyDir(t *testing.T, from, to string) {
	ents, _ := os.ReadDir(from)
	for _, e := range ents {
		if e.Name() == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFullIsRefusedNotFatal(t *testing.T) {
	dir := t.TempDir()
	cfg := testCfg(dir)
	cfg.MaxBytes = units.ByteSize(1 << 20)
	cfg.SegmentBytes = 256 << 10
	s := open(t, cfg)
	var accepted, refused int64
	for i := int64(1); i <= 40; i++ {
		err := s.Append(entry(i, 50_000))
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, ErrFull):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if refused == 0 || accepted == 0 {
		t.Fatalf("accepted %d refused %d", accepted, refused)
	}
	var total int64
	segs, _ := listSegments(dir)
	for _, g := range segs {
		total += g.size
	}
	if total > int64(cfg.MaxBytes) {
		t.Fatalf("spool holds %d bytes, max_bytes %d", total, cfg.MaxBytes)
	}
	if got := drain(t, s); !equal(got, seqRange(1, accepted)) {
		t.Fatalf("replayed %v, want the first %d", got, accepted)
	}
	// Space returns once consumed segments are deleted.
	if err := s.Append(entry(100, 50_000)); err != nil {
		t.Fatalf("append after drain: %v", err)
	}
}

func TestLockedDirectory(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testCfg(dir))
	appendN(t, s, 1, 3, 100)
	s2, _ := New(testCfg(dir), Options{Logger: quiet})
	if err := s2.Open(); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if _, err := Repair(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("repair while open: %v, want ErrLocked", err)
	}
	rep, err := Inspect(dir)
	if err != nil || !rep.Locked || rep.Pending != 3 {
		t.Fatalf("inspect while open: %+v %v", rep, err)
	}
}

// TestOpenDoesNotLoadTheSpool: opening and replaying a 48 MiB spool
// allocates a bounded amount (one frame and buffers), not the spool.
func TestOpenDoesNotLoadTheSpool(t *testing.T) {
	dir := t.TempDir()
	cfg := testCfg(dir)
	cfg.SegmentBytes = 8 << 20
	s := open(t, cfg)
	appendN(t, s, 1, 48, 1<<20)
	_ = s.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s2 := open(t, cfg)
	n := 0
	for {
		_, ok, err := s2.Peek()
		if err != nil || !ok {
			break
		}
		_ = s2.Advance()
		n++
	}
	runtime.ReadMemStats(&after)
	if n != 48 {
		t.Fatalf("replayed %d, want 48", n)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 12<<20 {
		t.Fatalf("open + replay of 48 MiB allocated %d MiB", alloc>>20)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"disabled", func(c *Config) { c.MaxBytes = 0; c.Dir = "" }, ""},
		{"no dir", func(c *Config) { c.Dir = "" }, "dir"},
		{"tiny", func(c *Config) { c.MaxBytes = 1000 }, "max_bytes"},
		{"segment above max", func(c *Config) { c.MaxBytes = 2 << 20; c.SegmentBytes = 4 << 20 }, "segment_bytes"},
		{"sync too long", func(c *Config) { c.SyncInterval = units.Duration(time.Hour) }, "sync_interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Dir = "/x"
			tc.mod(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !bytes.Contains([]byte(err.Error()), []byte(tc.want))) {
				t.Fatalf("got %v, want error about %q", err, tc.want)
			}
		})
	}
}

func benchSpool(b *testing.B, size int) {
	dir := b.TempDir()
	cfg := testCfg(dir)
	cfg.MaxBytes = 4 << 30
	cfg.SegmentBytes = 64 << 20
	s := open(b, cfg)
	e := entry(1, size)
	b.SetBytes(int64(size))
	b.Run("append", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			e.Seq = int64(i)
			if err := s.Append(e); err != nil {
				b.Fatal(err)
			}
		}
		s.Sync()
	})
	b.Run("replay", func(b *testing.B) {
		b.SetBytes(int64(size))
		for i := 0; i < b.N; i++ {
			_, ok, err := s.Peek()
			if err != nil {
				b.Fatal(err)
			}
			if !ok {
				b.StopTimer()
				appendN(b, s, 0, 1000, size)
				b.StartTimer()
				continue
			}
			if err := s.Advance(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSpool: 256 KiB entries ≈ a 6K-record agent batch.
func BenchmarkSpool(b *testing.B) { benchSpool(b, 256<<10) }
