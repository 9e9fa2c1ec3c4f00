package spool

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/tapflow/tapflow/internal/fsx"
)

// SegmentReport describes one segment file.
type SegmentReport struct {
	Path     string
	ID       int64
	Size     int64
	Entries  int64
	Records  int64
	FirstSeq int64
	LastSeq  int64
	Oldest   time.Time
	Newest   time.Time
	// Consumed is the number of entries before the replay cursor.
	Consumed int64
	Header   bool
	Problems []Problem
}

// Report is what Inspect, Verify and Repair found.
type Report struct {
	Dir      string
	Segments []SegmentReport
	// CursorSegment and CursorOffset locate the next entry to replay.
	CursorSegment, CursorOffset int64
	// Pending is the number of entries not yet replayed, Records their
	// flow records and PendingBytes their frame bytes.
	Pending, PendingRecords, PendingBytes int64
	// Locked is true when an agent holds the directory.
	Locked bool
	// Repaired lists what Repair changed.
	Repaired []string
}

// Problems returns the number of corrupt stretches found.
func (r *Report) Problems() int {
	n := 0
	for _, s := range r.Segments {
		n += len(s.Problems)
		if !s.Header {
			n++
		}
	}
	return n
}

// Inspect reads every segment of dir, one frame at a time, verifying each
// checksum, and reports entries, sequence ranges, ages and problems. It
// takes no lock and changes nothing; while an agent appends, the newest
// frames may be missing from the report.
func Inspect(dir string) (*Report, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("spool %s: %w (point at agent.spool.dir, default <data_dir>/agent/spool)", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("spool %s: not a directory", dir)
	}
	segs, err := listSegments(dir)
	if err != nil {
		return nil, err
	}
	r := &Report{Dir: dir}
	r.CursorSegment, r.CursorOffset, err = readCursor(dir)
	if err != nil {
		return nil, fmt.Errorf("spool %s: cursor: %w (repair resets it to the oldest segment)", dir, err)
	}
	if len(segs) > 0 && (r.CursorSegment < segs[0].id || r.CursorOffset < int64(len(segHeader))) {
		if r.CursorSegment < segs[0].id {
			r.CursorSegment = segs[0].id
		}
		r.CursorOffset = int64(len(segHeader))
	}
	if f, lerr := lockDir(dir); lerr != nil {
		r.Locked = errors.Is(lerr, ErrLocked)
	} else {
		f.Close()
	}
	for _, g := range segs {
		sr, err := scanSegment(dir, g, r.CursorSegment, r.CursorOffset, nil)
		if err != nil {
			return nil, err
		}
		r.Segments = append(r.Segments, sr)
		if g.id >= r.CursorSegment {
			r.Pending += sr.Entries - sr.Consumed
		}
	}
	r.PendingRecords, r.PendingBytes = pendingTotals(dir, segs, r)
	return r, nil
}

// pendingTotals sums records and frame bytes after the cursor.
func pendingTotals(dir string, segs []segment, r *Report) (records, bytes int64) {
	for _, g := range segs {
		if g.id < r.CursorSegment {
			continue
		}
		from := int64(len(segHeader))
		if g.id == r.CursorSegment {
			from = r.CursorOffset
		}
		f, err := os.Open(segPath(dir, g.id))
		if err != nil {
			continue
		}
		sc := newScanner(f, from, g.size)
		for {
			e, _, err := sc.next()
			if err != nil {
				break
			}
			records += int64(e.Records)
			bytes += e.frameSize()
		}
		f.Close()
	}
	return records, bytes
}

// scanSegment reads one segment; visit, when set, sees every valid frame
// with its offset (the body is valid during the call only).
func scanSegment(dir string, g segment, curSeg, curOff int64, visit func(e *Entry, off int64) error) (SegmentReport, error) {
	p := segPath(dir, g.id)
	sr := SegmentReport{Path: p, ID: g.id, Size: g.size}
	f, err := os.Open(p)
	if err != nil {
		return sr, fmt.Errorf("spool: open %s: %w", p, err)
	}
	defer f.Close()
	sr.Header = g.size >= int64(len(segHeader)) && hasHeader(f)
	if !sr.Header {
		return sr, nil
	}
	start := int64(len(segHeader))
	sc := newScanner(f, start, g.size)
	for {
		e, off, err := sc.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return sr, fmt.Errorf("spool: read %s: %w", p, err)
		}
		if sr.Entries == 0 {
			sr.FirstSeq, sr.Oldest = e.Seq, e.Created
		}
		sr.Entries++
		sr.Records += int64(e.Records)
		sr.LastSeq, sr.Newest = e.Seq, e.Created
		if g.id < curSeg || (g.id == curSeg && off < curOff) {
			sr.Consumed++
		}
		if visit != nil {
			if err := visit(&e, off); err != nil {
				return sr, err
			}
		}
	}
	sr.Problems = sc.problems
	return sr, nil
}

// Verify is Inspect; the caller treats any problem as a failure.
func Verify(dir string) (*Report, error) { return Inspect(dir) }

// Repair makes dir valid: a torn or corrupt tail is truncated, a segment
// with corrupt stretches inside is rewritten without them, a segment
// without a header is removed, and the cursor is moved onto a frame
// boundary. It refuses to run while an agent holds the directory. Entries
// in corrupt stretches are lost; the report says how many bytes.
func Repair(dir string) (*Report, error) {
	before, err := Inspect(dir)
	if err != nil {
		return nil, err
	}
	lf, err := lockDir(dir)
	if err != nil {
		return before, err
	}
	defer lf.Close()
	segs, err := listSegments(dir)
	if err != nil {
		return before, err
	}
	curSeg, curOff := before.CursorSegment, before.CursorOffset
	var changes []string
	for _, g := range segs {
		p := segPath(dir, g.id)
		sr, err := scanSegment(dir, g, curSeg, curOff, nil)
		if err != nil {
			return before, err
		}
		switch {
		case !sr.Header:
			if err := os.Remove(p); err != nil {
				return before, fmt.Errorf("spool repair: remove %s: %w", p, err)
			}
			changes = append(changes, fmt.Sprintf("%s: no valid header; removed (%d bytes)", p, g.size))
			if g.id == curSeg {
				curSeg, curOff = g.id+1, int64(len(segHeader))
			}
		case len(sr.Problems) == 1 && sr.Problems[0].Torn:
			pr := sr.Problems[0]
			if err := os.Truncate(p, pr.Offset); err != nil {
				return before, fmt.Errorf("spool repair: truncate %s: %w", p, err)
			}
			changes = append(changes, fmt.Sprintf("%s: torn tail of %d bytes at offset %d truncated (%s)", p, pr.Length, pr.Offset, pr.Reason))
			if g.id == curSeg && curOff > pr.Offset {
				curOff = pr.Offset
			}
		case len(sr.Problems) > 0:
			newOff, lost, err := rewrite(dir, g, curSeg, curOff)
			if err != nil {
				return before, err
			}
			changes = append(changes, fmt.Sprintf("%s: rewritten without %d corrupt stretch(es), %d bytes dropped", p, len(sr.Problems), lost))
			if g.id == curSeg {
				curOff = newOff
			}
		}
	}
	if len(changes) > 0 || curSeg != before.CursorSegment || curOff != before.CursorOffset {
		if err := writeCursor(dir, curSeg, curOff); err != nil {
			return before, fmt.Errorf("spool repair: write cursor: %w", err)
		}
		if err := fsx.SyncDir(dir); err != nil {
			return before, fmt.Errorf("spool repair: fsync %s: %w", dir, err)
		}
	}
	after, err := Inspect(dir)
	if err != nil {
		return before, err
	}
	after.Repaired = changes
	return after, nil
}

// rewrite copies the valid frames of g into a new file and renames it over
// g. It returns the cursor offset mapped into the new file (when the cursor
// is in g) and the bytes dropped.
func rewrite(dir string, g segment, curSeg, curOff int64) (int64, int64, error) {
	p := segPath(dir, g.id)
	tmp := p + ".repair"
	out, err := fsx.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fsx.PrivateFile, fsx.NoGroup)
	if err != nil {
		return 0, 0, fmt.Errorf("spool repair: create %s: %w", tmp, err)
	}
	defer func() { out.Close(); _ = os.Remove(tmp) }()
	if _, err := out.Write([]byte(segHeader)); err != nil {
		return 0, 0, fmt.Errorf("spool repair: write %s: %w", tmp, err)
	}
	written := int64(len(segHeader))
	newCur := int64(-1)
	var buf []byte
	_, err = scanSegment(dir, g, curSeg, curOff, func(e *Entry, off int64) error {
		if g.id == curSeg && newCur < 0 && off >= curOff {
			newCur = written
		}
		var err error
		if buf, err = appendFrame(buf[:0], e); err != nil {
			return err
		}
		n, err := out.Write(buf)
		written += int64(n)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("spool repair: copy %s: %w", p, err)
	}
	if newCur < 0 {
		newCur = written
	}
	if err := out.Sync(); err != nil {
		return 0, 0, fmt.Errorf("spool repair: fsync %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, 0, fmt.Errorf("spool repair: rename %s: %w", tmp, err)
	}
	return newCur, g.size - written, nil
}
