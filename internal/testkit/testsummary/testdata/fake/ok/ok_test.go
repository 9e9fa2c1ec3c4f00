package ok

import "testing"

func TestPass(t *testing.T) { t.Log("pass-log-line") }

func TestSkip(t *testing.T) { t.Skip("missing prerequisite: command nope (fix: make deps)") }

func TestShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: takes long")
	}
}

func TestSubs(t *testing.T) {
	t.Run("a", func(t *testing.T) { t.Log("sub-pass-line") })
	t.Run("b", func(t *testing.T) { t.Skipf("opt-in:\nset FAKE=1") })
}
