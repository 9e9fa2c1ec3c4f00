package parquet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	pq "github.com/parquet-go/parquet-go"
)

// MetadataBatches lists the agent batches whose records a file holds, per
// agent as sorted seq ranges: "agent-a:5-9,12;agent-b:3". With the file's
// partition it is what the ledger rebuilds the committed set from.
const MetadataBatches = "tapflow.batches"

// batchID is an agent batch: every record of it has the same agent_id and
// batch_seq.
type batchID struct {
	agent string
	seq   int64
}

type pieceKey struct {
	hour int64
	id   batchID
}

// Committed lists and reads the files already committed in a partition:
// the local output, or the object store when the output is remote.
type Committed interface {
	// List returns the names of the committed files of a partition
	// ("flows/dt=…/hour=…"); a missing partition is empty, not an error.
	List(partition string) ([]string, error)
	// Batches returns a file's MetadataBatches value ("" when absent).
	Batches(partition, name string) (string, error)
}

// localCommitted reads committed files under the output directory.
type localCommitted struct{ root string }

func (l localCommitted) List(partition string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(l.root, partition))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); !e.IsDir() && !strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".parquet") {
			names = append(names, n)
		}
	}
	return names, nil
}

func (l localCommitted) Batches(partition, name string) (string, error) {
	p := filepath.Join(l.root, partition, name)
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	return FooterBatches(f, st.Size())
}

// FooterBatches reads MetadataBatches from a Parquet footer, reading no
// page data.
func FooterBatches(r interface {
	ReadAt(p []byte, off int64) (int, error)
}, size int64) (string, error) {
	pf, err := pq.OpenFile(r, size, pq.SkipPageIndex(true), pq.SkipBloomFilters(true), pq.SkipMagicBytes(true))
	if err != nil {
		return "", err
	}
	v, _ := pf.Lookup(MetadataBatches)
	return v, nil
}

// ledger remembers, per hour partition, which agent batches are committed
// (and which are in this sink's open files), so a redelivered batch is
// never written twice. A partition is loaded lazily from the committed
// files' footers the first time a batch touches it, and re-listed when it
// was last listed more than refresh ago (to see other collectors' files);
// partitions untouched for a while are forgotten (bounded memory).
type ledger struct {
	src      Committed
	dir      string // schema directory: "flows"
	refresh  time.Duration
	maxParts int
	parts    map[int64]*partLedger
	now      func() time.Time
}

type partLedger struct {
	committed map[batchID]struct{}
	open      map[batchID]struct{}
	files     map[string]struct{}
	listed    time.Time
	touched   time.Time
}

func newLedger(src Committed, dir string) *ledger {
	return &ledger{src: src, dir: dir, refresh: 10 * time.Second, maxParts: 48, parts: map[int64]*partLedger{}, now: time.Now}
}

// part returns the ledger of hour, listing the partition when it is new
// or stale.
func (l *ledger) part(hour int64) (*partLedger, error) {
	now := l.now()
	p := l.parts[hour]
	if p == nil {
		p = &partLedger{committed: map[batchID]struct{}{}, open: map[batchID]struct{}{}, files: map[string]struct{}{}}
	}
	if p.listed.IsZero() || now.Sub(p.listed) > l.refresh {
		rel := l.dir + "/" + partition(hour)
		names, err := l.src.List(rel)
		if err != nil {
			return nil, fmt.Errorf("list committed files of %s: %w", rel, err)
		}
		for _, n := range names {
			if _, ok := p.files[n]; ok {
				continue
			}
			v, err := l.src.Batches(rel, n)
			if err != nil {
				return nil, fmt.Errorf("read footer of %s/%s: %w (a damaged committed file: move it aside)", rel, n, err)
			}
			ids, err := parseBatches(v)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: metadata %s: %w", rel, n, MetadataBatches, err)
			}
			for _, id := range ids {
				p.committed[id] = struct{}{}
			}
			p.files[n] = struct{}{}
		}
		p.listed = now
	}
	p.touched = now
	if l.parts[hour] == nil {
		l.parts[hour] = p
		l.evict(hour)
	}
	return p, nil
}

// evict forgets the least recently touched partitions beyond maxParts,
// never one with open pieces or keep.
func (l *ledger) evict(keep int64) {
	for len(l.parts) > l.maxParts {
		var oldest int64
		var at time.Time
		found := false
		for h, p := range l.parts {
			if h == keep || len(p.open) > 0 {
				continue
			}
			if !found || p.touched.Before(at) {
				oldest, at, found = h, p.touched, true
			}
		}
		if !found {
			return
		}
		delete(l.parts, oldest)
	}
}

// known reports whether the piece is committed or in an open file.
func (l *ledger) known(k pieceKey) (bool, error) {
	p, err := l.part(k.hour)
	if err != nil {
		return false, err
	}
	_, c := p.committed[k.id]
	_, o := p.open[k.id]
	return c || o, nil
}

func (l *ledger) markOpen(k pieceKey) {
	if p := l.parts[k.hour]; p != nil {
		p.open[k.id] = struct{}{}
	}
}

// committedFile moves a file's pieces from open to committed.
func (l *ledger) committedFile(hour int64, name string, ids map[batchID]struct{}) {
	p := l.parts[hour]
	if p == nil {
		return
	}
	for id := range ids {
		delete(p.open, id)
		p.committed[id] = struct{}{}
	}
	p.files[name] = struct{}{}
}

// dropOpen forgets every open piece (the open files were discarded).
func (l *ledger) dropOpen() {
	for _, p := range l.parts {
		clear(p.open)
	}
}

// formatBatches renders ids as MetadataBatches.
func formatBatches(ids map[batchID]struct{}) string {
	by := map[string][]int64{}
	for id := range ids {
		by[id.agent] = append(by[id.agent], id.seq)
	}
	agents := make([]string, 0, len(by))
	for a := range by {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	var b strings.Builder
	for i, a := range agents {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(a)
		b.WriteByte(':')
		b.WriteString(seqRanges(by[a]))
	}
	return b.String()
}

// parseBatches is the inverse of formatBatches.
func parseBatches(v string) ([]batchID, error) {
	var out []batchID
	if v == "" {
		return nil, nil
	}
	for _, part := range strings.Split(v, ";") {
		i := strings.LastIndexByte(part, ':')
		if i < 0 {
			return nil, fmt.Errorf("%q: want agent:ranges", part)
		}
		agent := part[:i]
		for _, r := range strings.Split(part[i+1:], ",") {
			lo, hi, ok := strings.Cut(r, "-")
			a, err := strconv.ParseInt(lo, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", r, err)
			}
			b := a
			if ok {
				if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a {
					return nil, fmt.Errorf("%q: bad range", r)
				}
			}
			if b-a > 1<<24 {
				return nil, fmt.Errorf("%q: range too large", r)
			}
			for s := a; s <= b; s++ {
				out = append(out, batchID{agent, s})
			}
		}
	}
	return slices.Clip(out), nil
}
