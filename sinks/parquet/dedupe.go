package parquet

// dedupe returns recs without the records whose piece (hour, agent batch)
// is committed or already in an open file; it counts what it drops.
func (s *Sink[T]) dedupe(recs []T) ([]T, error) {
	id, timeEnd := s.schema.Identity, s.schema.TimeEnd
	clear(s.pieces)
	dropped := 0
	var last pieceKey
	lastDup := false
	for i := range recs {
		a, q := id(&recs[i])
		k := pieceKey{hourOf(timeEnd(&recs[i])), batchID{a, q}}
		if i == 0 || k != last {
			dup, ok := s.pieces[k]
			if !ok {
				var err error
				if dup, err = s.ledger.known(k); err != nil {
					return nil, err
				}
				s.pieces[k] = dup
			}
			last, lastDup = k, dup
		}
		if lastDup {
			dropped++
		}
	}
	if dropped == 0 {
		return recs, nil
	}
	dupPieces := 0
	for _, dup := range s.pieces {
		if dup {
			dupPieces++
		}
	}
	s.m.dupRecords.Add(float64(dropped))
	s.m.dupPieces.Add(float64(dupPieces))
	kept := make([]T, 0, len(recs)-dropped)
	for i := range recs {
		a, q := id(&recs[i])
		if !s.pieces[pieceKey{hourOf(timeEnd(&recs[i])), batchID{a, q}}] {
			kept = append(kept, recs[i])
		}
	}
	s.log.Info("redelivered batch already committed; its committed records are not written again", "records_dropped", dropped, "records_kept", len(kept), "pieces", dupPieces)
	return kept, nil
}

// notePieces records the agent batches of rows (all in f's hour) in f and
// marks them open in the ledger.
func (s *Sink[T]) notePieces(f *file[T], rows []T) {
	if f.batches == nil {
		f.batches = map[batchID]struct{}{}
	}
	var last batchID
	for i := range rows {
		a, q := s.schema.Identity(&rows[i])
		id := batchID{a, q}
		if i > 0 && id == last {
			continue
		}
		last = id
		if _, ok := f.batches[id]; !ok {
			f.batches[id] = struct{}{}
			s.ledger.markOpen(pieceKey{f.hour, id})
		}
	}
}
