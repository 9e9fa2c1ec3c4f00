package schemas

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Wire codecs for the Arrow IPC body compression of NATS messages.
const (
	CodecZstd = "zstd" // 4–5× smaller; the default (DESIGN §5)
	CodecLZ4  = "lz4"  // ~2×, cheaper on CPU
	CodecNone = "none" // cheapest on loopback
)

// ValidCodec reports whether name is a known wire codec.
func ValidCodec(name string) bool {
	return name == CodecZstd || name == CodecLZ4 || name == CodecNone
}

// Encoder turns record slices into NATS message bodies: one self-contained
// Arrow IPC stream (schema + one record batch) per message, body-compressed.
// Safe for concurrent use.
type Encoder struct{ opts []ipc.Option }

// NewEncoder returns an Encoder for codec (see ValidCodec).
func NewEncoder(codec string) (*Encoder, error) {
	opts := []ipc.Option{ipc.WithSchema(ArrowSchema())}
	switch codec {
	case CodecZstd:
		opts = append(opts, ipc.WithZstd())
	case CodecLZ4:
		opts = append(opts, ipc.WithLZ4())
	case CodecNone, "":
	default:
		return nil, fmt.Errorf("wire codec %q: unknown; use zstd, lz4 or none", codec)
	}
	return &Encoder{opts: opts}, nil
}

// Encode appends the encoded form of recs to dst and returns it.
func (e *Encoder) Encode(dst []byte, recs []Flow) ([]byte, error) {
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

// Decoder turns message bodies back into records. Not safe for concurrent
// use (it keeps a string interner); use one per goroutine.
type Decoder struct{ in *Interner }

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder { return &Decoder{in: NewInterner()} }

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
		if dst, err = FromArrow(r.RecordBatch(), dst, d.in); err != nil {
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
