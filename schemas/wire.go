package schemas

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Wire codecs of NATS message bodies.
const (
	// CodecZstd: the whole Arrow IPC stream in one zstd frame (fastest
	// level): measured ~1.6× cheaper to encode than Arrow's per-buffer
	// zstd at about the same size. The default (DESIGN §5).
	CodecZstd = "zstd"
	// CodecLZ4: Arrow IPC with LZ4-frame buffer compression; ~2× smaller.
	CodecLZ4 = "lz4"
	// CodecNone: plain Arrow IPC; cheapest on loopback.
	CodecNone = "none"
)

// zstdMagic starts every zstd frame; an Arrow IPC stream starts with the
// 0xFFFFFFFF continuation marker instead, so bodies are self-describing.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// maxDecodedBody bounds a decompressed message (a corrupt or hostile
// frame must not exhaust memory).
const maxDecodedBody = 512 << 20

var (
	zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
	zstdDec, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecodedBody), zstd.WithDecoderConcurrency(0))
)

// ValidCodec reports whether name is a known wire codec.
func ValidCodec(name string) bool {
	return name == CodecZstd || name == CodecLZ4 || name == CodecNone
}

// Encoder turns record slices into NATS message bodies: one self-contained
// Arrow IPC stream (schema + one record batch) per message, body-compressed.
// Safe for concurrent use.
type Encoder struct {
	opts  []ipc.Option
	zstd  bool
	plain sync.Pool // *bytes.Buffer for the uncompressed stream
}

// NewEncoder returns an Encoder for codec (see ValidCodec).
func NewEncoder(codec string) (*Encoder, error) {
	opts := []ipc.Option{ipc.WithSchema(ArrowSchema())}
	e := &Encoder{}
	switch codec {
	case CodecZstd:
		e.zstd = true
	case CodecLZ4:
		opts = append(opts, ipc.WithLZ4())
	case CodecNone, "":
	default:
		return nil, fmt.Errorf("wire codec %q: unknown; use zstd, lz4 or none", codec)
	}
	e.opts = opts
	return e, nil
}

// Encode appends the encoded form of recs to dst and returns it.
func (e *Encoder) Encode(dst []byte, recs []Flow) ([]byte, error) {
	if !e.zstd {
		return e.encodeIPC(dst, recs)
	}
	plain, _ := e.plain.Get().(*[]byte)
	if plain == nil {
		plain = new([]byte)
	}
	defer e.plain.Put(plain)
	var err error
	if *plain, err = e.encodeIPC((*plain)[:0], recs); err != nil {
		return nil, err
	}
	return zstdEnc.EncodeAll(*plain, dst), nil
}

func (e *Encoder) encodeIPC(dst []byte, recs []Flow) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	rec := ToArrow(recs)
	defer rec.Release()
	w := ipc.NewWriter(buf, e.opts...)
	if err := w.Write(rec); err != nil {
		return nil, fmt.Errorf("encode arrow ipc: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("encode arrow ipc: %w", err)
	}
	return buf.Bytes(), nil
}

// ErrCorrupt marks a message body that is not a valid flow.v1 Arrow IPC
// stream. Callers dead-letter such messages instead of retrying them.
var ErrCorrupt = errors.New("corrupt flow batch")

// Decoder turns message bodies back into records. It is stateless and safe
// for concurrent use.
type Decoder struct{}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder { return &Decoder{} }

// Decode appends the records of body to dst. Any malformed input returns an
// error wrapping ErrCorrupt; it never panics.
func (d *Decoder) Decode(dst []Flow, body []byte) (out []Flow, err error) {
	defer func() {
		// arrow-go can panic on adversarial flatbuffers; a corrupt message
		// must never take the collector down.
		if r := recover(); r != nil {
			out, err = dst, fmt.Errorf("%w: arrow ipc panicked: %v", ErrCorrupt, r)
		}
	}()
	if bytes.HasPrefix(body, zstdMagic) {
		if body, err = zstdDec.DecodeAll(body, nil); err != nil {
			return dst, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
	}
	r, err := ipc.NewReader(bytes.NewReader(body))
	if err != nil {
		return dst, fmt.Errorf("%w: open arrow ipc stream: %v", ErrCorrupt, err)
	}
	defer r.Release()
	if v, _ := r.Schema().Metadata().GetValue(MetadataKey); v != "" && v != SchemaName {
		return dst, fmt.Errorf("%w: schema %q, want %q", ErrCorrupt, v, SchemaName)
	}
	start := len(dst)
	for r.Next() {
		if dst, err = FromArrow(r.RecordBatch(), dst); err != nil {
			return dst[:start], fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	if err := r.Err(); err != nil && !errors.Is(err, io.EOF) {
		return dst[:start], fmt.Errorf("%w: read arrow ipc: %v", ErrCorrupt, err)
	}
	return dst, nil
}

// SchemaName is the flow.v1 schema name (see columns.SchemaName).
const SchemaName = columns.SchemaName

// ParquetSchema returns the Parquet schema of flow.v1, derived from the
// generated struct tags (and so from the column table).
func ParquetSchema() *parquet.Schema { return parquet.SchemaOf(Flow{}) }
