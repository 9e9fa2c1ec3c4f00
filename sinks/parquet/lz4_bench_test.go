package parquet

import (
	"sync"

	"github.com/parquet-go/parquet-go/compress/lz4"
	"github.com/parquet-go/parquet-go/format"
	pierrec "github.com/pierrec/lz4/v4"
)

// lz4Raw is Parquet's LZ4_RAW with lz4's fast compressor, like
// parquet-go's lz4.Codec{Level: lz4.Fastest}, but with the compressor (a
// 64 KiB hash table) recycled: parquet-go's allocates one per page
// (11.9 GB allocated per 2.1 M records, BenchmarkCollectorWriter). Only
// the benchmark writes it: collector.compression does not offer LZ4_RAW
// (see Compressions).
type lz4Raw struct {
	lz4.Codec // Decode, as parquet-go does it
	pool      sync.Pool
}

// lz4RawCodec is shared: it only pools compressors.
var lz4RawCodec = newLZ4Raw()

func newLZ4Raw() *lz4Raw {
	return &lz4Raw{Codec: lz4.Codec{Level: lz4.Fastest}, pool: sync.Pool{New: func() any { return new(pierrec.Compressor) }}}
}

func (c *lz4Raw) String() string                            { return "LZ4_RAW" }
func (c *lz4Raw) CompressionCodec() format.CompressionCodec { return format.Lz4Raw }

func (c *lz4Raw) Encode(dst, src []byte) ([]byte, error) {
	n := pierrec.CompressBlockBound(len(src))
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	dst = dst[:n]
	comp := c.pool.Get().(*pierrec.Compressor)
	defer c.pool.Put(comp)
	m, err := comp.CompressBlock(src, dst)
	return dst[:m], err
}
