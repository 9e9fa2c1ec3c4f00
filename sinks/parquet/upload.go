package parquet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Remote is an object store the sink uploads committed files to.
type Remote interface {
	Committed
	// Upload stores the local file path as rel (relative to the output
	// root: flows/dt=…/hour=…/name.parquet), whole or not at all.
	Upload(ctx context.Context, path, rel string) error
	// String names the store for logs (s3://bucket/prefix).
	String() string
}

// incompleteAborter is a Remote that can abort the incomplete multipart
// uploads a writer left behind (s3out.Store): a failed upload whose abort
// failed too (S3 unreachable), or an upload cut by a crash.
type incompleteAborter interface {
	AbortIncomplete(ctx context.Context, dir, writer string) (int, error)
}

// abortIncomplete asks the remote to abort this writer's incomplete
// uploads; it runs when no upload of this sink is in flight (at start, and
// once S3 answers again after failures). Failures are logged: the next
// recovery or start tries again.
func (s *Sink[T]) abortIncomplete(ctx context.Context) {
	a, ok := s.remote.(incompleteAborter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := a.AbortIncomplete(ctx, s.schema.Dir, s.writer); err != nil && ctx.Err() == nil {
		s.log.Warn("cannot abort this writer's incomplete multipart uploads now; tried again after the next failed upload recovers and at the next start",
			"remote", s.remote.String(), "err", err)
	}
}

func remoteName(r Remote) string {
	if r == nil {
		return "none"
	}
	return r.String()
}

// rel is a committed file's path relative to the output root.
func (s *Sink[T]) rel(hour int64, name string) string {
	return s.schema.Dir + "/" + partition(hour) + "/" + name
}

// uploadAll uploads committed files and deletes the staged copies; it
// retries each until it is stored and returns an error only when the run
// context ends first.
func (s *Sink[T]) uploadAll(files []*file[T]) error {
	for _, f := range files {
		if err := s.uploadOne(f.final, s.rel(f.hour, filepath.Base(f.final))); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sink[T]) uploadOne(path, rel string) error {
	delay := 500 * time.Millisecond
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := s.remote.Upload(s.runCtx, path, rel)
		if err == nil {
			if attempt > 1 {
				s.log.Info("upload succeeded after retries; acks resume", "object", rel, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
				s.upLog = failLog{}
				s.abortIncomplete(s.runCtx) // what the failed attempts left
			}
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				s.log.Warn("cannot remove an uploaded staged file; remove it by hand", "path", path, "err", rerr)
			}
			return nil
		}
		s.m.uploadRetries.Inc()
		if now := time.Now(); now.Sub(s.upLog.at) > 30*time.Second {
			s.log.Error("upload to object store failed; holding acks and retrying (messages stay in-progress in JetStream)",
				"remote", s.remote.String(), "object", rel, "attempt", attempt, "retry_in", delay, "err", err, "failures_not_logged", s.upLog.suppressed)
			s.upLog.at, s.upLog.suppressed = now, 0
		} else {
			s.upLog.suppressed++
		}
		t := time.NewTimer(delay)
		select {
		case <-s.runCtx.Done():
			t.Stop()
			return fmt.Errorf("parquet sink: upload of %s to %s not done at stop (%w): %v", rel, s.remote, context.Cause(s.runCtx), err)
		case <-t.C:
		}
		maxDelay := 30 * time.Second
		if b, ok := s.remote.(interface{ MaxBackoff() time.Duration }); ok && b.MaxBackoff() > 0 {
			maxDelay = b.MaxBackoff()
		}
		delay = min(delay*2, maxDelay)
	}
}

// uploadStaged uploads the committed files a previous run left in staging.
func (s *Sink[T]) uploadStaged(ctx context.Context) {
	var staged []string
	_ = filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), ".") && strings.HasSuffix(d.Name(), ".parquet") {
			staged = append(staged, p)
		}
		return nil
	})
	if len(staged) == 0 {
		return
	}
	s.log.Info("uploading files a previous run committed but did not upload", "files", len(staged), "staging", s.root)
	for _, p := range staged {
		rel, err := filepath.Rel(filepath.Dir(s.root), p)
		if err != nil {
			continue
		}
		if err := s.uploadOne(p, filepath.ToSlash(rel)); err != nil {
			return // hard stop; Run notices ctx
		}
	}
}
