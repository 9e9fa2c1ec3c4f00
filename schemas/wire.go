package schemas

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Wire codecs of NATS message bodies (the nats.codec values and the
// Tapflow-Codec header). Every body is a standard Arrow IPC stream, or
// (zstd) one zstd frame holding one; docs/subscribers.md.
const (
	// CodecZstd: the whole Arrow IPC stream in one zstd frame (fastest
	// level). Subscribers decompress the body, then read Arrow.
	CodecZstd = "zstd"
	// CodecArrowZstd: Arrow IPC with the spec's ZSTD buffer compression;
	// readers with Arrow compression support decode it directly.
	CodecArrowZstd = "arrow-zstd"
	// CodecLZ4: Arrow IPC with the spec's LZ4_FRAME buffer compression.
	CodecLZ4 = "lz4"
	// CodecNone: plain Arrow IPC; cheapest on loopback.
	CodecNone = "none"
)

// Codecs lists the wire codecs, for help and validation messages.
var Codecs = []string{CodecZstd, CodecArrowZstd, CodecLZ4, CodecNone}

// zstdMagic starts every zstd frame; an Arrow IPC stream starts with the
// 0xFFFFFFFF continuation marker instead, so bodies are self-describing.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// maxDecodedBody bounds a decompressed message of an unlimited decoder
// (a corrupt or hostile frame must not exhaust memory); the collector
// decodes with a far lower cap (DecoderOf.Limited).
const maxDecodedBody = 512 << 20

var (
	zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
	zstdDec, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecodedBody), zstd.WithDecoderConcurrency(0))
)

// ValidCodec reports whether name is a known wire codec.
func ValidCodec(name string) bool { return slices.Contains(Codecs, name) }

// Encoder is an EncoderOf flow records.
type Encoder = EncoderOf[Flow]

// EncoderOf turns record slices into NATS message bodies: one
// self-contained Arrow IPC stream (schema + one record batch) per message,
// body-compressed. Safe for concurrent use.
type EncoderOf[T any] struct {
	t     *Table[T]
	opts  []ipc.Option // arrow-go's writer's, for the same stream (tests)
	zstd  bool
	codec string
	body  int8 // the messages' buffer compression (ipcCodec*)
	form  wireForm
	plain sync.Pool // *[]byte for the uncompressed stream
	// schemas are the schema messages met so far (ipcwrite.go).
	schemas schemaCache
	// idle are column arenas (the buffers of one message each) between
	// messages, at most maxIdleArenas. Not a sync.Pool: its per-P slots
	// made an agent that encodes one message at a time keep an arena per
	// P and more after each GC, each sized for a whole batch.
	mu   sync.Mutex
	idle []*colArena
}

// maxIdleArenas bounds the arenas an encoder keeps: a publisher encodes
// one message at a time; a second covers a concurrent caller.
const maxIdleArenas = 2

func (e *EncoderOf[T]) takeArena() *colArena {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := len(e.idle); n > 0 {
		a := e.idle[n-1]
		e.idle[n-1] = nil
		e.idle = e.idle[:n-1]
		return a
	}
	return new(colArena)
}

// putArena keeps a for a later message, or drops it when maxIdleArenas
// are idle already.
func (e *EncoderOf[T]) putArena(a *colArena) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.idle) < maxIdleArenas {
		e.idle = append(e.idle, a)
	}
}

// NewEncoder returns a flow.v1 Encoder for codec (see ValidCodec).
func NewEncoder(codec string) (*Encoder, error) { return NewEncoderFor(FlowTable, codec) }

// NewEncoderFor returns an encoder of t's records for codec (see
// ValidCodec).
func NewEncoderFor[T any](t *Table[T], codec string) (*EncoderOf[T], error) {
	opts := []ipc.Option{ipc.WithSchema(t.ArrowSchema())}
	e := &EncoderOf[T]{t: t, body: ipcCodecNone}
	switch codec {
	case CodecZstd:
		e.zstd = true
	case CodecArrowZstd:
		opts = append(opts, ipc.WithZstd())
		e.body = ipcCodecZstd
	case CodecLZ4:
		opts = append(opts, ipc.WithLZ4())
		e.body = ipcCodecLZ4Frame
	case CodecNone, "":
		codec = CodecNone
	default:
		return nil, fmt.Errorf("wire codec %q: unknown; use %s", codec, strings.Join(Codecs, ", "))
	}
	e.opts, e.codec = opts, codec
	return e, nil
}

// PlainStrings returns an encoder like e (a fresh one: call it before
// use) that sends every string column as plain utf8, the wire form of
// agents before wire dictionaries: for tests of mixed fleets and for
// measuring one form against the other. Decoders accept both.
func (e *EncoderOf[T]) PlainStrings() *EncoderOf[T] {
	opts := slices.Clone(e.opts)
	opts[0] = ipc.WithSchema(e.t.PlainArrowSchema())
	return &EncoderOf[T]{t: e.t, opts: opts, zstd: e.zstd, codec: e.codec, body: e.body, form: formPlain}
}

// WideIndices returns an encoder like e (a fresh one: call it before
// use) whose dictionaries keep int32 indices whatever their size, the
// wire form of agents before narrow indices: for tests of mixed fleets
// and for measuring one form against the other. Decoders accept both.
func (e *EncoderOf[T]) WideIndices() *EncoderOf[T] {
	return &EncoderOf[T]{t: e.t, opts: slices.Clone(e.opts), zstd: e.zstd, codec: e.codec, body: e.body, form: formWide}
}

// Codec is the wire codec name (the Tapflow-Codec header value).
func (e *EncoderOf[T]) Codec() string { return e.codec }

// Schema is the schema name of the records (the Tapflow-Schema header
// value): flow.v1.
func (e *EncoderOf[T]) Schema() string { return e.t.name }

// Identity is one batch's record identity: the agent that publishes it
// and its batch sequence number. A record's index is its position in the
// batch.
type Identity struct {
	AgentID  string
	BatchSeq int64
}

// Encode appends the encoded form of recs to dst and returns it; the
// identity columns are the records' own.
func (e *EncoderOf[T]) Encode(dst []byte, recs []T) ([]byte, error) {
	return e.encode(dst, recs, nil)
}

// EncodeBatch is Encode of one batch whose identity columns are id's
// (agent_id, batch_seq) and each record's position (record_index),
// whatever the records' fields hold: a publisher stamps no record.
func (e *EncoderOf[T]) EncodeBatch(dst []byte, recs []T, id Identity) ([]byte, error) {
	return e.encode(dst, recs, &id)
}

func (e *EncoderOf[T]) encode(dst []byte, recs []T, id *Identity) ([]byte, error) {
	if !e.zstd {
		return e.encodeIPC(dst, recs, id)
	}
	plain, _ := e.plain.Get().(*[]byte)
	if plain == nil {
		plain = new([]byte)
	}
	defer e.plain.Put(plain)
	var err error
	if *plain, err = e.encodeIPC((*plain)[:0], recs, id); err != nil {
		return nil, err
	}
	return zstdEnc.EncodeAll(*plain, dst), nil
}

func (e *EncoderOf[T]) encodeIPC(dst []byte, recs []T, id *Identity) ([]byte, error) {
	a := e.takeArena()
	a.reset()
	defer e.putArena(a)
	cols := e.t.encode(recs, id, e.form, a)
	w := &a.ipc
	w.reset(e.body)
	schema := e.schemas.get(&w.key, func() *arrow.Schema { return e.t.wireSchema(e.form, cols) }, e.form, cols)
	return w.write(dst, schema, cols, len(recs))
}

// ErrCorrupt marks a message body that is not a valid Arrow IPC stream of
// the decoder's schema. Callers dead-letter such messages instead of
// retrying them.
var ErrCorrupt = errors.New("corrupt flow batch")

// ErrTooLarge marks a message that decodes to more bytes or records than a
// limited decoder allows (a zstd or LZ4 bomb, or millions of empty rows
// in a few KB). It is detected while decoding, before the memory is
// allocated. Callers dead-letter such messages.
var ErrTooLarge = errors.New("message too large")

// Decoder is a DecoderOf flow records.
type Decoder = DecoderOf[Flow]

// DecoderOf turns message bodies back into records. It is stateless and
// safe for concurrent use.
type DecoderOf[T any] struct {
	t *Table[T]
	// Limits (0: none beyond maxDecodedBody); see Limited.
	maxBytes   int64
	maxRecords int
	zstd       *zstd.Decoder // nil: the shared zstdDec
	pool       *BufferPool   // row tables only: see WithPool
}

// NewDecoder returns a flow.v1 Decoder.
func NewDecoder() *Decoder { return NewDecoderFor(FlowTable) }

// NewDecoderFor returns a decoder of t's records.
func NewDecoderFor[T any](t *Table[T]) *DecoderOf[T] { return &DecoderOf[T]{t: t} }

// Limited returns a decoder like d that refuses, with an error wrapping
// ErrTooLarge, a message whose zstd frame decompresses to more than
// maxBytes, whose Arrow buffers (the IPC body and what LZ4 buffers
// expand to) add up to more than maxBytes, or that holds more than
// maxRecords records. Every check runs before the memory it guards is
// allocated, so a hostile message costs at most about 2×maxBytes plus
// maxRecords decoded records.
func (d *DecoderOf[T]) Limited(maxBytes int64, maxRecords int) (*DecoderOf[T], error) {
	if maxBytes <= 0 || maxBytes > maxDecodedBody || maxRecords <= 0 {
		return nil, fmt.Errorf("decoder limits: max bytes %d (1..%d) and max records %d (>0)", maxBytes, maxDecodedBody, maxRecords)
	}
	zd, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(uint64(maxBytes)), zstd.WithDecoderConcurrency(0))
	if err != nil {
		return nil, fmt.Errorf("decoder limits: zstd: %w", err)
	}
	return &DecoderOf[T]{t: d.t, maxBytes: maxBytes, maxRecords: maxRecords, zstd: zd, pool: d.pool}, nil
}

// WithPool returns a decoder like d whose row decodes (a Table[Row])
// take their Arrow buffers from p and give them back once ReleaseRows
// has released every row of the message (bufpool.go). Other tables copy
// what they decode and ignore p.
func (d *DecoderOf[T]) WithPool(p *BufferPool) *DecoderOf[T] {
	c := *d
	c.pool = p
	return &c
}

// budget is an Arrow allocator that refuses, by panicking, once the bytes
// it handed out exceed its limit: arrow-go sizes buffers from message
// metadata, so a hostile header could otherwise ask for gigabytes. arrow-go
// turns the panic into an error (or Decode recovers it); over tells
// Decode it was the budget.
type budget struct {
	used, limit, want int64
	over              bool
	next              memory.Allocator // what it hands out
}

func (b *budget) take(n int) {
	if b.used+int64(n) > b.limit {
		b.over, b.want = true, b.used+int64(n)
		panic("tapflow: arrow allocation over the message budget")
	}
	b.used += int64(n)
}

func (b *budget) Allocate(size int) []byte {
	b.take(size)
	return b.next.Allocate(size)
}

func (b *budget) Reallocate(size int, p []byte) []byte {
	b.take(size - len(p))
	return b.next.Reallocate(size, p)
}

func (b *budget) Free(p []byte) { b.next.Free(p) }

// Decode appends the records of body to dst. Any malformed input, or a
// stream whose schema metadata names another schema (a meter.v1 message on
// the flow stream), returns an error wrapping ErrCorrupt; a message beyond
// a limited decoder's limits returns one wrapping ErrTooLarge. It never
// panics.
func (d *DecoderOf[T]) Decode(dst []T, body []byte) (out []T, err error) {
	start := len(dst)
	var alloc memory.Allocator = memory.DefaultAllocator
	var ar *arena
	ownRows := false // dst is the message's alone: the caller passed none
	if _, rows := any(d.t).(*Table[Row]); rows && d.pool != nil {
		ar = d.pool.newArena()
		alloc = ar
		if cap(dst) == 0 {
			pooled, _ := any(d.pool.getRows()).([]T)
			dst, ownRows = pooled, true
		}
	}
	var bud *budget
	if d.maxBytes > 0 {
		bud = &budget{limit: d.maxBytes, next: alloc}
	}
	defer func() {
		// arrow-go can panic on adversarial flatbuffers; a corrupt message
		// must never take the collector down.
		if r := recover(); r != nil {
			out, err = dst[:start], fmt.Errorf("%w: arrow ipc panicked: %v", ErrCorrupt, r)
		}
		if err != nil && bud != nil && bud.over {
			out, err = dst[:start], fmt.Errorf("%w: arrow buffers need %d bytes or more, limit %d", ErrTooLarge, bud.want, bud.limit)
		}
		if ar != nil {
			// The message's Chunks own the arena; with none (an error, no
			// rows) nothing reads it.
			rows, _ := any(out).([]Row)
			if err != nil {
				rows = nil
			} else if ownRows && len(rows) > 0 {
				// It comes back with the buffers. On an error it is the
				// caller's.
				ar.rows = rows
			}
			ar.adoptRows(rows[min(start, len(rows)):])
		}
	}()
	owned := bytes.HasPrefix(body, zstdMagic)
	if owned {
		zd := zstdDec
		if d.zstd != nil {
			zd = d.zstd
		}
		if body, err = zd.DecodeAll(body, nil); err != nil {
			if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
				return dst, fmt.Errorf("%w: zstd frame decompresses to more than %d bytes", ErrTooLarge, d.limitBytes())
			}
			return dst, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
	}
	// Structure first: arrow-go allocates what a message declares before
	// reading it, outside any allocator (checkIPC).
	cost, raw, err := checkIPC(body, d.maxBytes, int64(d.maxRecords))
	if err != nil {
		return dst, err
	}
	opts := []ipc.Option{ipc.WithMetadataSizeLimit(int64(len(body))), ipc.WithBodySizeLimit(int64(len(body)))}
	if bud != nil {
		// What arrow-go allocates beside its allocator: metadata copies,
		// per-column objects, the decompressors' windows.
		if cost > bud.limit {
			return dst, fmt.Errorf("%w: arrow ipc metadata and decompressors need %d bytes, limit %d", ErrTooLarge, cost, bud.limit)
		}
		bud.used = cost
		opts = append(opts, ipc.WithAllocator(bud))
	} else if ar != nil {
		opts = append(opts, ipc.WithAllocator(ar))
	}
	var r *ipc.Reader
	if owned || !raw {
		r, err = ipc.NewReaderFromMessageReader(newSliceMessages(body), opts...)
	} else {
		r, err = ipc.NewReader(bytes.NewReader(body), opts...)
	}
	if err != nil {
		return dst, fmt.Errorf("%w: open arrow ipc stream: %v", ErrCorrupt, err)
	}
	defer r.Release()
	if v, _ := r.Schema().Metadata().GetValue(MetadataKey); v != "" && v != d.t.name {
		return dst, fmt.Errorf("%w: schema %q, want %q", ErrCorrupt, v, d.t.name)
	}
	for r.Next() {
		rec := r.RecordBatch()
		if n := int64(len(dst)-start) + rec.NumRows(); d.maxRecords > 0 && n > int64(d.maxRecords) {
			return dst[:start], fmt.Errorf("%w: %d records or more, limit %d", ErrTooLarge, n, d.maxRecords)
		}
		if dst, err = d.t.FromArrow(rec, dst); err != nil {
			return dst[:start], fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
	}
	if err := r.Err(); err != nil && !errors.Is(err, io.EOF) {
		return dst[:start], fmt.Errorf("%w: read arrow ipc: %v", ErrCorrupt, err)
	}
	return dst, nil
}

func (d *DecoderOf[T]) limitBytes() int64 {
	if d.maxBytes > 0 {
		return d.maxBytes
	}
	return maxDecodedBody
}

// SchemaName is the flow.v1 schema name (see columns.SchemaName).
const SchemaName = columns.SchemaName

// MeterSchemaName is the meter.v1 schema name (see columns.MeterSchemaName).
const MeterSchemaName = columns.MeterSchemaName

// ParquetSchema returns the Parquet schema of flow.v1
// (FlowTable.ParquetSchema).
func ParquetSchema() *parquet.Schema { return FlowTable.ParquetSchema() }
