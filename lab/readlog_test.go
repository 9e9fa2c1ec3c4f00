package lab_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tapflow/tapflow/lab"
)

// TestReadLog: ReadLog parses tapflow's JSON log lines with their time,
// skips what is not JSON (a panic trace, a half-written last line) and
// reads a missing file as no entries.
func TestReadLog(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, body string
		want       []lab.LogEntry
	}{
		{"missing", "", nil},
		{"entries and noise", `{"time":"2026-12-02T16:21:10.585960111Z","level":"INFO","msg":"tapflow starting"}
goroutine 1 [running]:
{"time":"2026-12-02T16:21:11Z","level":"WARN","msg":"interface lost","ifname":"tap1","lost_packets":3,"err":"x"}
{"time":"2026-12-02T16:21:12Z","lev`, []lab.LogEntry{
			{Time: time.Date(2026, 12, 2, 16, 21, 10, 585960111, time.UTC), Level: "INFO", Msg: "tapflow starting"},
			{Time: time.Date(2026, 12, 2, 16, 21, 11, 0, time.UTC), Level: "WARN", Msg: "interface lost", Ifname: "tap1", LostPackets: 3, Err: "x"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".json")
			if tc.body != "" {
				if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got := lab.ReadLog(p)
			if len(got) != len(tc.want) {
				t.Fatalf("%d entries, want %d: %+v", len(got), len(tc.want), got)
			}
			for i := range got {
				if !got[i].Time.Equal(tc.want[i].Time) {
					t.Errorf("entry %d: time %v, want %v", i, got[i].Time, tc.want[i].Time)
				}
				got[i].Time = tc.want[i].Time
				if got[i] != tc.want[i] {
					t.Errorf("entry %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
