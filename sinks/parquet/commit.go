package parquet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tapflow/tapflow/internal/fsx"
)

// commit makes files durable under their final names: footer, fsync,
// close; rename; fsync of the directories. On error the caller aborts.
func (s *Sink[T]) commit(files []*file[T]) error {
	for _, f := range files {
		f.w.SetKeyValueMetadata(MetadataWriter, s.writer)
		f.w.SetKeyValueMetadata(MetadataBatchSeqs, seqRanges(f.seqs))
		if s.ledger != nil {
			f.w.SetKeyValueMetadata(MetadataBatches, formatBatches(f.batches))
		}
		if err := f.w.Close(); err != nil {
			return commitError("write", f.tmp, err)
		}
		if err := f.f.Sync(); err != nil {
			return commitError("fsync", f.tmp, err)
		}
		err := f.f.Close()
		f.f = nil
		if err != nil {
			return commitError("close", f.tmp, err)
		}
	}
	dirs := make(map[string]struct{}, len(files)+len(s.syncDirs))
	for _, f := range files {
		final, err := s.finalName(f)
		if err != nil {
			return err
		}
		if err := os.Rename(f.tmp, final); err != nil {
			return commitError("rename", f.tmp, err)
		}
		f.final = final
		dirs[f.dir] = struct{}{}
	}
	for d := range s.syncDirs {
		dirs[d] = struct{}{}
	}
	for d := range dirs {
		if err := fsx.SyncDir(d); err != nil {
			return commitError("fsync dir", d, err)
		}
	}
	clear(s.syncDirs)
	return nil
}

// finalName is <writer>-<first seq>-<last seq>.parquet, seqs zero-padded
// to 20 digits so names sort. An existing file is never replaced: the
// name gets a -N suffix instead (a redelivered batch range).
func (s *Sink[T]) finalName(f *file[T]) (string, error) {
	first, last := slices.Min(f.seqs), slices.Max(f.seqs)
	base := fmt.Sprintf("%s-%020d-%020d", s.writer, first, last)
	for n := 0; ; n++ {
		name := base + ".parquet"
		if n > 0 {
			name = fmt.Sprintf("%s-%d.parquet", base, n)
		}
		p := filepath.Join(f.dir, name)
		_, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			if n > 0 {
				s.log.Warn("parquet file name taken (redelivered batches?); using a suffix", "taken", filepath.Join(f.dir, base+".parquet"), "file", p)
			}
			return p, nil
		}
		if err != nil {
			return "", commitError("stat", p, err)
		}
	}
}

// seqRanges renders seqs as sorted, merged ranges: "1-3,7,9-10".
func seqRanges(seqs []int64) string {
	v := slices.Clone(seqs)
	slices.Sort(v)
	v = slices.Compact(v)
	var b strings.Builder
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v[i], 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatInt(v[j], 10))
		}
		i = j + 1
	}
	return b.String()
}
