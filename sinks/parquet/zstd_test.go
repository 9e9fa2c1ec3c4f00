package parquet

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/parquet-go/parquet-go/compress/zstd"
)

// zstdSample is n bytes that compress, but not to nothing.
func zstdSample(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefgh"[r.IntN(8)]
	}
	return b
}

// TestZstdCodecSameBytes: the sink's codec writes the bytes parquet-go's
// writes, at both levels the sink offers, and reads them back.
func TestZstdCodecSameBytes(t *testing.T) {
	for _, name := range []string{CompressionZstd, CompressionZstdDefault} {
		if c, _ := codecFor(name); fmt.Sprintf("%T", c) != "*parquet.zstdCodec" {
			t.Fatalf("%s: codec %T, want *parquet.zstdCodec", name, c)
		}
	}
	for _, level := range []zstd.Level{zstd.SpeedFastest, zstd.SpeedDefault} {
		ours, theirs := newZstdCodec(level), &zstd.Codec{Level: level}
		for i, n := range []int{0, 1, 100, 64 << 10, 256 << 10, 1 << 20} {
			src := zstdSample(uint64(i), n)
			got, err := ours.Encode(nil, src)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := theirs.Encode(nil, src)
			if !bytes.Equal(got, want) {
				t.Fatalf("level %v, %d bytes: output differs from parquet-go's codec", level, n)
			}
			back, err := ours.Decode(nil, got)
			if err != nil || !bytes.Equal(back, src) {
				t.Fatalf("level %v, %d bytes: read back %d bytes, err %v", level, n, len(back), err)
			}
		}
	}
}

// TestZstdCodecBounded pushes over ten times the codec's idle cap through
// it, sequentially and from concurrent goroutines: every page reads back
// as written, no Encode is stuck, the idle encoders stay within the cap,
// and one goroutine at a time reuses one encoder throughout.
func TestZstdCodecBounded(t *testing.T) {
	for _, tc := range []struct {
		idle, workers, pages int
	}{
		{idle: 1, workers: 1, pages: 20},
		{idle: 1, workers: 4, pages: 40},
		{idle: 2, workers: 1, pages: 30},
		{idle: 2, workers: 8, pages: 200},
		{idle: 4, workers: 16, pages: 400},
	} {
		t.Run(fmt.Sprintf("idle%d/workers%d", tc.idle, tc.workers), func(t *testing.T) {
			c := newZstdCodecCap(zstd.SpeedFastest, tc.idle)
			if tc.pages < 10*tc.idle {
				t.Fatalf("%d pages: not ten times the cap %d", tc.pages, tc.idle)
			}
			var wg sync.WaitGroup
			errs := make(chan error, tc.pages)
			next := make(chan int, tc.pages)
			for i := range tc.pages {
				next <- i
			}
			close(next)
			for range tc.workers {
				wg.Go(func() {
					var dst []byte
					for i := range next {
						src := zstdSample(uint64(i), 1000+i*97)
						var err error
						if dst, err = c.Encode(dst, src); err != nil {
							errs <- err
							return
						}
						if back, err := c.Decode(nil, dst); err != nil || !bytes.Equal(back, src) {
							errs <- fmt.Errorf("page %d: read back %d of %d bytes, err %v", i, len(back), len(src), err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if n := len(c.idle); n > tc.idle || n < 1 {
				t.Fatalf("%d idle encoders, want 1..%d", n, tc.idle)
			}
			if tc.workers == 1 && c.made.Load() != 1 {
				t.Fatalf("one goroutine built %d encoders for %d pages, want 1", c.made.Load(), tc.pages)
			}
			if made := c.made.Load(); made > int64(tc.pages) {
				t.Fatalf("%d encoders built for %d pages", made, tc.pages)
			}
		})
	}
}
