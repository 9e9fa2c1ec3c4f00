package bad

import (
	"os"
	"testing"
	"time"
)

func TestPass(t *testing.T) { t.Log("pass-log-line") }

func TestFail(t *testing.T) {
	t.Log("fail-log-before")
	t.Run("inner", func(t *testing.T) { t.Error("inner-boom") })
	t.Run("fine", func(t *testing.T) { t.Log("fine-line") })
}

// TestHang runs last (alphabetically after TestFail; no -shuffle here)
// and hangs only when asked: the package then times out.
func TestHang(t *testing.T) {
	if os.Getenv("FAKE_HANG") == "" {
		return
	}
	t.Log("hang-log-before")
	time.Sleep(time.Hour)
}
