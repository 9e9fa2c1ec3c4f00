package parquet

import (
	"fmt"
	"sync/atomic"

	kzstd "github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// zstdIdleEncoders caps the encoders a zstdCodec keeps between pages: a
// sink compresses from one goroutine (Run), and billing's delivery too.
const zstdIdleEncoders = 1

// zstdCodec is parquet-go's zstd codec (String, CompressionCodec, Decode;
// Encode with the same encoder options, so the same bytes) keeping its
// idle encoders in a bounded free list instead of parquet-go's sync.Pool.
// A sync.Pool keeps a lone encoder in the private slot of the P that put
// it, which a Get on another P does not see, and drops it after two
// garbage collections without use: one sink, whose goroutine moves
// between Ps, built encoders again and again, each allocating its
// window's history (megabytes). The list keeps up to its cap for the
// codec's life (the sink's); a concurrent Encode beyond it builds an
// encoder and drops it afterwards, as a pool miss did.
type zstdCodec struct {
	zstd.Codec
	idle chan *kzstd.Encoder
	made atomic.Int64 // encoders built (tests)
}

func newZstdCodec(level zstd.Level) *zstdCodec {
	return newZstdCodecCap(level, zstdIdleEncoders)
}

func newZstdCodecCap(level zstd.Level, idle int) *zstdCodec {
	return &zstdCodec{Codec: zstd.Codec{Level: level}, idle: make(chan *kzstd.Encoder, idle)}
}

// Encode compresses src into dst[:0] as parquet-go's Codec.Encode does.
func (c *zstdCodec) Encode(dst, src []byte) ([]byte, error) {
	var e *kzstd.Encoder
	select {
	case e = <-c.idle:
	default:
		var err error
		// parquet-go's options (compress/zstd), for the same output.
		e, err = kzstd.NewWriter(nil,
			kzstd.WithEncoderConcurrency(1),
			kzstd.WithEncoderLevel(c.Level),
			kzstd.WithZeroFrames(true),
			kzstd.WithEncoderCRC(false),
		)
		if err != nil {
			return dst[:0], fmt.Errorf("zstd encoder: %w", err)
		}
		c.made.Add(1)
	}
	out := e.EncodeAll(src, dst[:0])
	select {
	case c.idle <- e:
	default: // cap reached: left to the garbage collector
	}
	return out, nil
}
