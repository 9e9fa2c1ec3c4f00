package schemas

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// ToArrowWide is FlowTable.ToArrow in the int32 indices of agents before
// narrow indices (WideIndices), for benchmarks.
func ToArrowWide(recs []Flow) arrow.RecordBatch { return FlowTable.toArrow(recs, nil, formWide, nil) }

// withForm is e in the given wire form.
func (e *EncoderOf[T]) withForm(f wireForm) *EncoderOf[T] {
	switch f {
	case formPlain:
		return e.PlainStrings()
	case formWide:
		return e.WideIndices()
	}
	return e
}

// ToArrowPlain is FlowTable.ToArrow in plain utf8 (PlainStrings), for
// benchmarks.
func ToArrowPlain(recs []Flow) arrow.RecordBatch { return FlowTable.toArrow(recs, nil, formPlain, nil) }

// SetDictGroups turns the encoder's dictionary groups on or off
// (dictgroup.go), for tests and benchmarks; not safe while encoding.
func SetDictGroups(on bool) { dictGroupsOff = !on }

// SetDictGroupsCollide gives every tuple of a dictionary group the same
// hash, so only the compare tells them apart; not safe while encoding.
func SetDictGroupsCollide(on bool) { dictGroupsCollide = on }

// encodeArrowGo is EncodeBatch (Encode with id nil) through arrow-go's
// ipc.Writer with the encoder's options, the writer the encoders used
// before ipcwrite.go: the reference of TestIPCWriterSameBytes.
func (e *EncoderOf[T]) encodeArrowGo(recs []T, id *Identity) ([]byte, error) {
	rec := e.t.toArrow(recs, id, e.form, nil)
	defer rec.Release()
	opts := slices.Clone(e.opts)
	if e.form != formPlain { // narrow indices, IP columns as sent
		opts = append(opts, ipc.WithSchema(rec.Schema()))
	}
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, opts...)
	if err := w.Write(rec); err != nil {
		return nil, fmt.Errorf("arrow-go write: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("arrow-go close: %w", err)
	}
	if e.zstd {
		return zstdEnc.EncodeAll(buf.Bytes(), nil), nil
	}
	return buf.Bytes(), nil
}

// IdleArenas is the number of column arenas e keeps between messages.
func (e *EncoderOf[T]) IdleArenas() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.idle)
}

// TakeArenas takes n arenas as n concurrent messages would and returns
// them.
func (e *EncoderOf[T]) TakeArenas(n int) {
	as := make([]*colArena, n)
	for i := range as {
		as[i] = e.takeArena()
	}
	for _, a := range as {
		e.putArena(a)
	}
}
