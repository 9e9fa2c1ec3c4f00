package usage

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tapflow/tapflow/internal/fsx"
)

// Status is where an hour stands.
type Status string

const (
	// Published: the hour's totals are in the receiver (Revision).
	Published Status = "published"
	// Held: its audit failed (or it has no meters); not published, retried
	// at every pass. An hour published earlier keeps its published totals.
	Held Status = "held"
	// Empty: the audit checked nothing (no record): nothing to bill.
	Empty Status = "empty"
)

// Key is one billed series: what CloudKitty groups and prices by.
type Key struct {
	Project         string `json:"project_id"`
	Zone            string `json:"zone"`
	Direction       string `json:"direction"`
	ExternalNetwork string `json:"external_network"`
	LB              string `json:"lb_id"`
}

func (k Key) compare(o Key) int {
	return cmp.Or(strings.Compare(k.Project, o.Project), strings.Compare(k.Zone, o.Zone), strings.Compare(k.Direction, o.Direction),
		strings.Compare(k.ExternalNetwork, o.ExternalNetwork), strings.Compare(k.LB, o.LB))
}

// Total is one key's exact sums for an hour.
type Total struct {
	Key
	Bytes   int64 `json:"bytes"`
	Packets int64 `json:"packets"`
}

// Totals are an hour's totals, sorted by key.
type Totals []Total

func (t Totals) sorted() Totals {
	slices.SortFunc(t, func(a, b Total) int { return a.compare(b.Key) })
	return t
}

func (t Totals) index() map[Key]Total {
	m := make(map[Key]Total, len(t))
	for _, r := range t {
		m[r.Key] = r
	}
	return m
}

// Sum is the sum over every key.
func (t Totals) Sum() (bytes, packets int64) {
	for _, r := range t {
		bytes += r.Bytes
		packets += r.Packets
	}
	return bytes, packets
}

// Pending is a revision being written: saved before the write, so a crash
// between the write and the save of its outcome re-sends exactly the same
// samples (the receiver accepts identical samples again) instead of
// computing a different difference at the same timestamps.
type Pending struct {
	Revision int    `json:"revision"`
	Totals   Totals `json:"totals"`
}

// HourState is what the state directory keeps per hour.
type HourState struct {
	Hour   time.Time `json:"hour"`
	Status Status    `json:"status"`
	// Revision is the last revision published (0: the first), -1 none.
	Revision int `json:"revision"`
	// Totals are what the receiver holds for the hour (the sum of every
	// revision's samples).
	Totals  Totals   `json:"totals,omitempty"`
	Pending *Pending `json:"pending,omitempty"`
	// Files fingerprints the hour's flow and meter files when it was last
	// processed: an hour is processed again only when it changes (a late
	// file), or while held or pending.
	Files string `json:"files"`
	// Findings are the audit's mismatches of a held hour.
	Findings []string `json:"findings,omitempty"`
	// Unreprocessed are projects whose correction the Corrector has not
	// taken yet (retried at every pass).
	Unreprocessed []string `json:"unreprocessed,omitempty"`
	// Delivered is the Files fingerprint last handed to the Delivery
	// (Options.Delivery): the hour is delivered again when its published
	// files differ (a correction, a failed delivery).
	Delivered   string    `json:"delivered,omitempty"`
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
	PublishedAt time.Time `json:"published_at,omitzero"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// stateStore is a directory of one JSON file per hour, 0600 in a 0700
// directory, replaced atomically (write, fsync, rename, fsync dir).
type stateStore struct{ dir string }

const hourLayout = "2006-01-02T15"

func openState(dir string) (*stateStore, error) {
	if err := fsx.MkdirAll(dir, 0o700, fsx.NoGroup); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	return &stateStore{dir: dir}, nil
}

func (s *stateStore) path(h time.Time) string {
	return filepath.Join(s.dir, h.UTC().Format(hourLayout)+".json")
}

// load returns the hour's state, or a fresh one (Revision -1).
func (s *stateStore) load(h time.Time) (*HourState, error) {
	b, err := os.ReadFile(s.path(h))
	if errors.Is(err, fs.ErrNotExist) {
		return &HourState{Hour: h, Revision: -1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	var st HourState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("state %s: %w; move the file away to publish the hour again from scratch (its published totals are then unknown: delete its series in Prometheus first)", s.path(h), err)
	}
	return &st, nil
}

func (s *stateStore) save(st *HourState) error {
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	p := s.path(st.Hour)
	tmp := filepath.Join(s.dir, "."+filepath.Base(p)+".tmp")
	f, err := fsx.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600, fsx.NoGroup)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = fsx.SyncDir(s.dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("state %s: %w", p, err)
	}
	return nil
}

// all returns the state of every hour at or after since (zero: all),
// oldest first; older files are not read.
func (s *stateStore) all(since time.Time) ([]*HourState, error) {
	es, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	var out []*HourState
	for _, e := range es {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		h, err := time.Parse(hourLayout, name)
		if err != nil || h.Before(since) {
			continue
		}
		st, err := s.load(h)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// lock takes the state directory's lock file (flock): one process at a
// time processes hours, so a `tapflow billing publish` next to the service
// can never write a revision the other is writing too. It waits for ctx.
func (s *stateStore) lock(ctx context.Context) (unlock func(), err error) {
	f, err := fsx.OpenFile(filepath.Join(s.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600, fsx.NoGroup)
	if err != nil {
		return nil, fmt.Errorf("state lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("state lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("state lock %s: another tapflow billing is processing hours: %w", f.Name(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
