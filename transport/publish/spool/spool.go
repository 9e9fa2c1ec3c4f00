package spool

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/fsx"
)

// ErrFull is returned by Append when the entry does not fit in MaxBytes.
var ErrFull = errors.New("spool full")

// ErrLocked is returned by Open and Repair when another process holds the
// spool directory.
var ErrLocked = errors.New("spool directory is locked by another process")

const (
	segSuffix  = ".seg"
	cursorName = "cursor"
	lockName   = "lock"
)

// Options are the collaborators of a Spool.
type Options struct {
	Logger *slog.Logger
	// Registry receives the tapflow_spool_* metrics; nil registers none.
	Registry prometheus.Registerer
}

type segment struct {
	id   int64
	size int64
}

// Spool is a bounded, crash-safe FIFO of Entries on disk. Append may be
// called concurrently with Peek/Advance (one writer, one reader).
type Spool struct {
	cfg Config
	log *slog.Logger
	m   *Metrics

	mu       sync.Mutex
	open     bool
	lockF    *os.File
	segs     []segment // ascending id; the last is the append target
	total    int64     // bytes of every segment
	w        *os.File  // last segment, opened for append
	wbuf     []byte
	dirty    bool
	lastSync time.Time

	// Read side: the next entry is in segment rid at offset roff.
	rid, roff int64
	rf        *os.File
	rfID      int64
	sc        *scanner
	head      *Entry
	headEnd   int64
	pending   int64 // entries not yet consumed
	pendingB  int64 // bytes not yet consumed (frames)
}

// New validates cfg and registers the metrics; it touches no file.
func New(cfg Config, opts Options) (*Spool, error) {
	if !cfg.Enabled() {
		return nil, errors.New("spool: max_bytes is 0 (disabled)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("spool config: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Spool{cfg: cfg, log: log.With("component", "spool", "dir", cfg.Dir), m: newMetrics()}
	s.m.MaxBytes.Set(float64(cfg.MaxBytes))
	if opts.Registry != nil {
		if err := s.m.register(opts.Registry); err != nil {
			return nil, fmt.Errorf("spool: register metrics: %w", err)
		}
	}
	return s, nil
}

// Metrics returns the spool's metrics (for callers that count losses).
func (s *Spool) Metrics() *Metrics { return s.m }

// Dir returns the spool directory.
func (s *Spool) Dir() string { return s.cfg.Dir }

// Open locks the directory, finds the segments and the replay cursor, and
// truncates a torn last frame (counted). It reads only the last segment
// whole, one frame at a time.
func (s *Spool) Open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open {
		return errors.New("spool: already open")
	}
	if err := fsx.MkdirAll(s.cfg.Dir, fsx.PrivateDir, fsx.NoGroup); err != nil {
		return fmt.Errorf("spool: create %s: %w (set agent.spool.dir to a writable local directory)", s.cfg.Dir, err)
	}
	lf, err := lockDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	s.lockF = lf
	ok := false
	defer func() {
		if !ok {
			s.closeFiles()
		}
	}()
	if s.segs, err = listSegments(s.cfg.Dir); err != nil {
		return err
	}
	s.rid, s.roff, err = readCursor(s.cfg.Dir)
	if err != nil {
		s.log.Warn("spool cursor unreadable; replaying from the oldest segment (entries may be published twice, the collector drops them)", "err", err)
		s.rid, s.roff = 0, 0
	}
	// Segments before the cursor are consumed leftovers of a crash between
	// cursor update and delete.
	for len(s.segs) > 0 && s.segs[0].id < s.rid {
		if err := os.Remove(segPath(s.cfg.Dir, s.segs[0].id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("spool: remove consumed segment: %w", err)
		}
		s.segs = s.segs[1:]
	}
	if len(s.segs) == 0 || s.segs[0].id != s.rid {
		s.roff = 0 // cursor segment is gone: start at the oldest
		if len(s.segs) > 0 {
			s.rid = s.segs[0].id
		}
	}
	if s.roff < int64(len(segHeader)) {
		s.roff = int64(len(segHeader))
	}
	if len(s.segs) > 0 {
		if err := s.recoverTail(); err != nil {
			return err
		}
	}
	if err := s.countPending(); err != nil {
		return err
	}
	for _, g := range s.segs {
		s.total += g.size
	}
	if len(s.segs) == 0 {
		if err := s.newSegment(1); err != nil {
			return err
		}
		s.rid, s.roff = 1, int64(len(segHeader))
	} else {
		last := s.segs[len(s.segs)-1]
		if s.w, err = os.OpenFile(segPath(s.cfg.Dir, last.id), os.O_WRONLY|os.O_APPEND, 0); err != nil {
			return fmt.Errorf("spool: open segment for append: %w", err)
		}
	}
	s.open = true
	ok = true
	s.updateGauges()
	if s.pending > 0 {
		s.log.Info("spool holds batches from a previous run; replaying them first", "entries", s.pending, "bytes", s.pendingB, "segments", len(s.segs))
	}
	return nil
}

func lockDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, lockName)
	f, err := fsx.OpenFile(p, os.O_RDWR|os.O_CREATE, fsx.PrivateFile, fsx.NoGroup)
	if err != nil {
		return nil, fmt.Errorf("spool: open lock %s: %w", p, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (is an agent running on it? stop it first, or give each agent its own agent.spool.dir)", ErrLocked, dir)
		}
		return nil, fmt.Errorf("spool: lock %s: %w", p, err)
	}
	return f, nil
}

func segPath(dir string, id int64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", id, segSuffix))
}

func listSegments(dir string) ([]segment, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: list %s: %w", dir, err)
	}
	var segs []segment
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, segSuffix) || e.IsDir() {
			continue
		}
		id, err := strconv.ParseInt(strings.TrimSuffix(name, segSuffix), 10, 64)
		if err != nil || id <= 0 {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("spool: stat %s: %w", name, err)
		}
		segs = append(segs, segment{id: id, size: info.Size()})
	}
	slices.SortFunc(segs, func(a, b segment) int { return cmp.Compare(a.id, b.id) })
	return segs, nil
}

func readCursor(dir string) (id, off int64, err error) {
	b, err := os.ReadFile(filepath.Join(dir, cursorName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("cursor %q: want \"<segment> <offset>\"", b)
	}
	if id, err = strconv.ParseInt(f[0], 10, 64); err == nil {
		off, err = strconv.ParseInt(f[1], 10, 64)
	}
	return id, off, err
}

func writeCursor(dir string, id, off int64) error {
	p := filepath.Join(dir, cursorName)
	tmp := p + ".tmp"
	if err := fsx.WriteFile(tmp, []byte(fmt.Sprintf("%d %d\n", id, off)), fsx.PrivateFile, fsx.NoGroup); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// recoverTail validates the last segment and truncates a torn tail.
func (s *Spool) recoverTail() error {
	last := &s.segs[len(s.segs)-1]
	p := segPath(s.cfg.Dir, last.id)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("spool: open %s: %w", p, err)
	}
	defer f.Close()
	if last.size < int64(len(segHeader)) || !hasHeader(f) {
		// Created but the header never made it: rewrite it.
		s.m.TornTails.Inc()
		s.log.Warn("spool segment without a valid header truncated", "segment", p, "bytes", last.size)
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("spool: truncate %s: %w", p, err)
		}
		if _, err := f.WriteAt([]byte(segHeader), 0); err != nil {
			return fmt.Errorf("spool: rewrite header of %s: %w", p, err)
		}
		last.size = int64(len(segHeader))
		return f.Sync()
	}
	sc := newScanner(f, int64(len(segHeader)), last.size)
	for {
		if _, _, err := sc.next(); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("spool: scan %s: %w", p, err)
		}
	}
	for _, pr := range sc.problems {
		if pr.Torn {
			s.m.TornTails.Inc()
			s.m.CorruptBytes.Add(float64(pr.Length))
			s.log.Warn("spool: torn last write truncated (an append was cut by a crash)", "segment", p, "offset", pr.Offset, "bytes", pr.Length, "reason", pr.Reason)
			if err := f.Truncate(pr.Offset); err != nil {
				return fmt.Errorf("spool: truncate torn tail of %s at %d: %w (run `tapflow spool repair %s`)", p, pr.Offset, err, s.cfg.Dir)
			}
			last.size = pr.Offset
			if err := f.Sync(); err != nil {
				return fmt.Errorf("spool: fsync %s: %w", p, err)
			}
		} else {
			s.log.Warn("spool: corrupt stretch inside the last segment; it will be skipped on replay", "segment", p, "offset", pr.Offset, "bytes", pr.Length, "reason", pr.Reason)
		}
	}
	return nil
}

func hasHeader(f *os.File) bool {
	var b [len(segHeader)]byte
	_, err := f.ReadAt(b[:], 0)
	return err == nil && string(b[:]) == segHeader
}

// countPending walks frame headers from the cursor on (no payload reads).
// Corrupt stretches end the walk of their segment; the count is then a
// lower bound, which is only used for metrics and Empty.
func (s *Spool) countPending() error {
	s.pending, s.pendingB = 0, 0
	for _, g := range s.segs {
		if g.id < s.rid {
			continue
		}
		off := int64(len(segHeader))
		if g.id == s.rid {
			off = s.roff
		}
		f, err := os.Open(segPath(s.cfg.Dir, g.id))
		if err != nil {
			return fmt.Errorf("spool: open segment: %w", err)
		}
		var hdr [frameHdrLen]byte
		for off+frameHdrLen <= g.size {
			if _, err := f.ReadAt(hdr[:], off); err != nil {
				break
			}
			n := int64(binary.LittleEndian.Uint32(hdr[4:]))
			if binary.LittleEndian.Uint32(hdr[:]) != frameMagic || n > MaxFrame || off+frameHdrLen+n > g.size {
				// Unknown stretch: assume it holds entries (replay finds out).
				s.pending++
				s.pendingB += g.size - off
				break
			}
			s.pending++
			s.pendingB += frameHdrLen + n
			off += frameHdrLen + n
		}
		f.Close()
	}
	return nil
}

func (s *Spool) newSegment(id int64) error {
	p := segPath(s.cfg.Dir, id)
	f, err := fsx.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, fsx.PrivateFile, fsx.NoGroup)
	if err != nil {
		return fmt.Errorf("spool: create segment %s: %w", p, err)
	}
	if _, err := f.Write([]byte(segHeader)); err != nil {
		f.Close()
		_ = os.Remove(p)
		return fmt.Errorf("spool: write segment header %s: %w", p, err)
	}
	if err := fsx.SyncDir(s.cfg.Dir); err != nil {
		f.Close()
		return fmt.Errorf("spool: fsync %s: %w", s.cfg.Dir, err)
	}
	s.w = f
	s.segs = append(s.segs, segment{id: id, size: int64(len(segHeader))})
	s.total += int64(len(segHeader))
	return nil
}

// Append adds e at the tail. It returns ErrFull (wrapped) when e does not
// fit in MaxBytes, and an I/O error (e.g. ENOSPC) after undoing a partial
// write; in both cases the spool is unchanged and the caller accounts for
// the loss. Append never blocks on the reader.
func (s *Spool) Append(e *Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		return errors.New("spool: not open")
	}
	size := e.frameSize()
	last := &s.segs[len(s.segs)-1]
	roll := last.size > int64(len(segHeader)) && last.size+size > int64(s.cfg.SegmentBytes)
	need := size
	if roll {
		need += int64(len(segHeader))
	}
	if s.total+need > int64(s.cfg.MaxBytes) {
		return fmt.Errorf("%w: %s holds %d of max_bytes %d; entry of %d bytes refused", ErrFull, s.cfg.Dir, s.total, int64(s.cfg.MaxBytes), size)
	}
	var err error
	if s.wbuf, err = appendFrame(s.wbuf[:0], e); err != nil {
		return err
	}
	if roll {
		if err := s.seal(); err != nil {
			return err
		}
		if err := s.newSegment(last.id + 1); err != nil {
			return err
		}
		last = &s.segs[len(s.segs)-1]
	}
	n, err := s.w.Write(s.wbuf)
	if err != nil {
		// Undo a partial frame so the segment stays valid.
		if n > 0 {
			if terr := s.w.Truncate(last.size); terr != nil {
				s.log.Error("spool: cannot undo a partial append; the next start truncates it", "err", terr)
			}
		}
		s.m.WriteErrors.Inc()
		return fmt.Errorf("spool: append to %s: %w", segPath(s.cfg.Dir, last.id), err)
	}
	last.size += size
	s.total += size
	s.pending++
	s.pendingB += size
	s.dirty = true
	s.m.Appended.Inc()
	s.m.AppendedBytes.Add(float64(size))
	if s.cfg.SyncInterval == 0 || time.Since(s.lastSync) >= s.cfg.SyncInterval.D() {
		s.syncLocked()
	}
	s.updateGauges()
	return nil
}

// seal fsyncs and closes the append segment.
func (s *Spool) seal() error {
	if s.w == nil {
		return nil
	}
	err := s.w.Sync()
	if cerr := s.w.Close(); err == nil {
		err = cerr
	}
	s.w, s.dirty = nil, false
	if err != nil {
		return fmt.Errorf("spool: seal segment: %w", err)
	}
	return nil
}

func (s *Spool) syncLocked() {
	if !s.dirty || s.w == nil {
		return
	}
	if err := s.w.Sync(); err != nil {
		s.m.WriteErrors.Inc()
		s.log.Warn("spool: fsync failed", "err", err)
		return
	}
	s.dirty, s.lastSync = false, time.Now()
}

// SyncInterval is the configured bound on unsynced appends.
func (s *Spool) SyncInterval() time.Duration { return s.cfg.SyncInterval.D() }

// Sync makes every appended entry durable; the publisher calls it every
// SyncInterval, so an append never stays unsynced longer.
func (s *Spool) Sync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncLocked()
}

// Empty reports whether every appended entry has been consumed.
func (s *Spool) Empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending == 0
}

// Pending returns the entries and frame bytes not yet consumed.
func (s *Spool) Pending() (entries, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending, s.pendingB
}

// Peek returns the oldest unconsumed entry, or false when there is none.
// Its Body is valid until the next Peek or Advance. Corrupt stretches met
// on the way are skipped, logged and counted.
func (s *Spool) Peek() (*Entry, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head != nil {
		return s.head, true, nil
	}
	for {
		idx := slices.IndexFunc(s.segs, func(g segment) bool { return g.id == s.rid })
		if idx < 0 {
			return nil, false, fmt.Errorf("spool: cursor segment %d vanished from %s", s.rid, s.cfg.Dir)
		}
		g := s.segs[idx]
		if s.roff < g.size {
			e, end, err := s.readAt(g)
			if err != nil {
				return nil, false, err
			}
			if e != nil {
				s.head, s.headEnd = e, end
				return e, true, nil
			}
			// Only corrupt bytes were left in this segment.
			s.roff = g.size
		}
		if idx == len(s.segs)-1 {
			s.pending, s.pendingB = 0, 0 // the count was an estimate
			s.updateGauges()
			return nil, false, nil
		}
		if err := s.dropSegment(idx); err != nil {
			return nil, false, err
		}
	}
}

// readAt reads the entry at the cursor; nil when the segment has no
// further valid frame.
func (s *Spool) readAt(g segment) (*Entry, int64, error) {
	if s.rf == nil || s.rfID != g.id {
		if s.rf != nil {
			s.rf.Close()
		}
		f, err := os.Open(segPath(s.cfg.Dir, g.id))
		if err != nil {
			return nil, 0, fmt.Errorf("spool: open segment for replay: %w", err)
		}
		s.rf, s.rfID = f, g.id
	}
	if s.sc == nil {
		s.sc = &scanner{}
	}
	sc := s.sc
	sc.ra = s.rf
	sc.reset(s.roff, g.size, 64<<10)
	e, off, err := sc.next()
	for _, pr := range sc.problems {
		s.m.CorruptBytes.Add(float64(pr.Length))
		s.log.Error("spool: corrupt stretch skipped during replay; its batches are lost", "segment", segPath(s.cfg.Dir, g.id),
			"offset", pr.Offset, "bytes", pr.Length, "reason", pr.Reason)
	}
	if err == io.EOF {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("spool: replay %s: %w", segPath(s.cfg.Dir, g.id), err)
	}
	s.roff = off
	return &e, sc.off, nil
}

// Advance consumes the entry Peek returned.
func (s *Spool) Advance() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == nil {
		return errors.New("spool: Advance without Peek")
	}
	size := s.headEnd - s.roff
	s.head, s.roff = nil, s.headEnd
	s.pending = max(s.pending-1, 0)
	s.pendingB = max(s.pendingB-size, 0)
	s.m.Replayed.Inc()
	idx := slices.IndexFunc(s.segs, func(g segment) bool { return g.id == s.rid })
	if idx >= 0 && idx < len(s.segs)-1 && s.roff >= s.segs[idx].size {
		if err := s.dropSegment(idx); err != nil {
			return err
		}
	} else if err := writeCursor(s.cfg.Dir, s.rid, s.roff); err != nil {
		return fmt.Errorf("spool: persist cursor in %s: %w", s.cfg.Dir, err)
	}
	s.updateGauges()
	return nil
}

// dropSegment deletes the fully consumed segment at idx (not the last) and
// moves the cursor to the next one.
func (s *Spool) dropSegment(idx int) error {
	g := s.segs[idx]
	next := s.segs[idx+1].id
	// Cursor first: a crash between the two leaves a consumed segment that
	// Open removes.
	if err := writeCursor(s.cfg.Dir, next, int64(len(segHeader))); err != nil {
		return fmt.Errorf("spool: persist cursor in %s: %w", s.cfg.Dir, err)
	}
	if s.rf != nil && s.rfID == g.id {
		s.rf.Close()
		s.rf = nil
	}
	if err := os.Remove(segPath(s.cfg.Dir, g.id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("spool: remove consumed segment: %w", err)
	}
	s.segs = slices.Delete(s.segs, idx, idx+1)
	s.total -= g.size
	s.rid, s.roff = next, int64(len(segHeader))
	return nil
}

func (s *Spool) updateGauges() {
	s.m.Bytes.Set(float64(s.total))
	s.m.Entries.Set(float64(s.pending))
}

// Close syncs and closes the files and releases the lock. The metrics stay
// registered (the registry belongs to the process).
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.w != nil {
		err = s.w.Sync()
	}
	s.closeFiles()
	s.open = false
	return err
}

func (s *Spool) closeFiles() {
	if s.w != nil {
		s.w.Close()
		s.w = nil
	}
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	if s.lockF != nil {
		s.lockF.Close() // releases the flock
		s.lockF = nil
	}
}
