package schemas

import "github.com/apache/arrow-go/v18/arrow"

// ToArrowWide is FlowTable.ToArrow in the int32 indices of agents before
// narrow indices (WideIndices), for benchmarks.
func ToArrowWide(recs []Flow) arrow.RecordBatch { return FlowTable.toArrow(recs, formWide, nil) }

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
