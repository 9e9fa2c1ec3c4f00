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

// Encoder is an EncoderOf flow records.
type Encoder = EncoderOf[Flow]

// EncoderOf turns record slices into NATS message bodies: one
// self-contained Arrow IPC stream (schema + one record batch) per message,
// body-compressed. Safe for concurrent use.
type EncoderOf[T any] struct {
	t     *Table[T]
	opts  []ipc.Option
	zstd  bool
	plain sync.Pool // *bytes.Buffer for the uncompressed stream
}

// NewEncoder returns a flow.v1 Encoder for codec (see ValidCodec).
func NewEncoder(codec string) (*Encoder, error) { return NewEncoderFor(FlowTable, codec) }

// NewEncoderFor returns an encoder of t's records for codec (see
// ValidCodec).
func NewEncoderFor[T any](t *Table[T], codec string) (*EncoderOf[T], error) {
	opts := []ipc.Option{ipc.WithSchema(t.ArrowSchema())}
	e := &EncoderOf[T]{t: t}
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
func (e *EncoderOf[T]) Encode(dst []byte, recs []T) ([]byte, error) {
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

func (e *EncoderOf[T]) encodeIPC(dst []byte, recs []T) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	rec := e.t.ToArrow(recs)
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

// ErrCorrupt marks a message body that is not a valid Arrow IPC stream of
// the decoder's schema. Callers dead-letter such messages instead of
// retrying them.
var ErrCorrupt = errors.New("corrupt flow batch")

// Decoder is a DecoderOf flow records.
type Decoder = DecoderOf[Flow]

// DecoderOf turns message bodies back into records. It is stateless and
// safe for concurrent use.
type DecoderOf[T any] struct{ t *Table[T] }

// NewDecoder returns a flow.v1 Decoder.
func NewDecoder() *Decoder { return NewDecoderFor(FlowTable) }

// NewDecoderFor returns a decoder of t's records.
func NewDecoderFor[T any](t *Table[T]) *DecoderOf[T] { return &DecoderOf[T]{t: t} }

// Decode appends the records of body to dst. Any malformed input, or a
// stream whose schema metadata names another schema (a meter.v1 message on
// the flow stream), returns an error wrapping ErrCorrupt; it never panics.
func (d *DecoderOf[T]) Decode(dst []T, body []byte) (out []T, err error) {
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
	if v, _ := r.Schema().Metadata().GetValue(MetadataKey); v != "" && v != d.t.name {
		return dst, fmt.Errorf("%w: schema %q, want %q", ErrCorrupt, v, d.t.name)
	}
	start := len(dst)
	for r.Next() {
		if dst, err = d.t.FromArrow(r.RecordBatch(), dst); err != nil {
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

// MeterSchemaName is the meter.v1 schema name (see columns.MeterSchemaName).
const MeterSchemaName = columns.MeterSchemaName

// ParquetSchema returns the Parquet schema of flow.v1
// (FlowTable.ParquetSchema).
func ParquetSchema() *parquet.Schema { return FlowTable.ParquetSchema() }
