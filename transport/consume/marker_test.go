package consume

import "testing"

// TestMarkerRing: a seq left in slot 0 (the process died decoding it)
// becomes a suspect at the next open; the last 16 such deaths are kept,
// newest first; a cleared slot 0 adds nothing.
func TestMarkerRing(t *testing.T) {
	dir := t.TempDir()
	for i, step := range []struct {
		died         uint64 // left in slot 0 by the "process"
		wantDied     uint64 // reported by the next open
		wantSuspects []uint64
		notSuspects  []uint64
	}{
		{0, 0, nil, []uint64{1}},
		{7, 7, []uint64{7}, []uint64{0}},
		{0, 0, []uint64{7}, nil},
		{9, 9, []uint64{7, 9}, nil},
	} {
		m, _, err := openMarker(dir, "S")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.set(step.died); err != nil {
			t.Fatal(err)
		}
		m.close()
		m, died, err := openMarker(dir, "S")
		if err != nil {
			t.Fatal(err)
		}
		if died != step.wantDied {
			t.Errorf("step %d: died %d, want %d", i, died, step.wantDied)
		}
		for _, s := range step.wantSuspects {
			if m.suspects[s] == 0 {
				t.Errorf("step %d: %d not a suspect: %v", i, s, m.suspects)
			}
		}
		for _, s := range step.notSuspects {
			if m.suspects[s] > 0 {
				t.Errorf("step %d: %d a suspect: %v", i, s, m.suspects)
			}
		}
		m.close()
	}
	// 20 more deaths: the 16 newest stay.
	for seq := uint64(100); seq < 120; seq++ {
		m, _, err := openMarker(dir, "S")
		if err != nil {
			t.Fatal(err)
		}
		_ = m.set(seq)
		m.close()
	}
	m, died, err := openMarker(dir, "S")
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	if died != 119 || len(m.suspects) != markerSlots-1 || m.suspects[104] != 1 || m.suspects[103] != 0 || m.suspects[7] != 0 {
		t.Fatalf("died %d, suspects %v; want 104..119", died, m.suspects)
	}
}

// TestCulpritNeedsRepeatedDeaths: one death while decoding a message (a
// random SIGKILL in a redelivery burst) does not make it poison; dying on
// it poisonDeaths times does.
func TestCulpritNeedsRepeatedDeaths(t *testing.T) {
	dir := t.TempDir()
	for deaths := 1; deaths <= poisonDeaths+1; deaths++ {
		m, _, err := openMarker(dir, "S")
		if err != nil {
			t.Fatal(err)
		}
		_ = m.set(42) // and the process dies
		m.close()
		m, _, err = openMarker(dir, "S")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := m.culprit(42), deaths >= poisonDeaths; got != want {
			t.Errorf("after %d deaths on seq 42: culprit %v, want %v (suspects %v)", deaths, got, want, m.suspects)
		}
		if m.culprit(43) {
			t.Errorf("seq 43, never died on, is a culprit")
		}
		m.close()
	}
}
