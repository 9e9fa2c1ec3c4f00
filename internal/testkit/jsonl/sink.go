package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tapflow/tapflow/internal/fsx"
	"github.com/tapflow/tapflow/pipeline"
)

// Sink writes records as JSON lines to one file. It is a pipeline.Sink;
// Run is called once.
type Sink struct {
	path string
}

// New checks path; it creates nothing. The file is created (truncated) by
// Run.
func New(path string) (*Sink, error) {
	if path == "" {
		return nil, errors.New("jsonl sink: empty path; give the file to write, e.g. /tmp/flows.jsonl")
	}
	return &Sink{path: path}, nil
}

// Name implements pipeline.Sink.
func (s *Sink) Name() string { return "jsonl" }

// Path returns the file written.
func (s *Sink) Path() string { return s.path }

// Close implements the component contract; the sink holds nothing once Run
// has returned.
func (s *Sink) Close() error { return nil }

// Run writes every batch of in to the file and holds its ack. When in is
// closed it flushes, fsyncs and closes the file, then acks every batch
// (nil, or the error if any step failed). If ctx is cancelled it acks what
// it holds and everything still arriving with an error and returns nil.
// A file that cannot be created or written is returned as an error after
// the batches are failed.
func (s *Sink) Run(ctx context.Context, in <-chan *pipeline.Batch) error {
	var held pipeline.AckGroup
	fail := func(err error) error {
		held.Ack(err)
		for b := range in {
			b.Ack(err)
		}
		return err
	}
	f, err := fsx.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fsx.DataFile, fsx.NoGroup)
	if err != nil {
		return fail(fmt.Errorf("jsonl sink: create %s: %w; make %s writable or choose another file", s.path, err, filepath.Dir(s.path)))
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(bw)
	stop := func() error {
		_ = f.Close()
		_ = os.Remove(s.path)
		err := fmt.Errorf("jsonl sink %s: stopped before commit: %w", s.path, context.Cause(ctx))
		held.Ack(err)
		for b := range in {
			b.Ack(err)
		}
		return nil
	}
	for {
		if ctx.Err() != nil {
			return stop()
		}
		select {
		case <-ctx.Done():
			return stop()
		case b, ok := <-in:
			if !ok {
				if ctx.Err() != nil {
					return stop()
				}
				err := bw.Flush()
				if err == nil {
					err = f.Sync()
				}
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fail(fmt.Errorf("jsonl sink: write %s: %w", s.path, err))
				}
				held.Ack(nil)
				return nil
			}
			held.Add(b)
			for i := range b.Records {
				b.Records[i].FillText() // a binary record's addresses (the capture's) as text
				if err := enc.Encode(&b.Records[i]); err != nil {
					_ = f.Close()
					return fail(fmt.Errorf("jsonl sink: write %s: %w", s.path, err))
				}
			}
		}
	}
}
