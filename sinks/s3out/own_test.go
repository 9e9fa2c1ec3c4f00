package s3out

import "testing"

// TestOwnFile: AbortIncomplete touches only the writer's own file names,
// never another writer's whose name shares a prefix.
func TestOwnFile(t *testing.T) {
	const a, b = "00000000000000000001", "00000000000000000009"
	for _, tc := range []struct {
		key, writer string
		want        bool
	}{
		{"p/flows/dt=2026-11-29/hour=10/c1-" + a + "-" + b + ".parquet", "c1", true},
		{"flows/dt=2026-11-29/hour=10/c1-" + a + "-" + b + "-2.parquet", "c1", true},
		{"c1-" + a + "-" + b + ".parquet", "c1", true},
		{"p/flows/dt=2026-11-29/hour=10/c10-" + a + "-" + b + ".parquet", "c1", false},
		{"p/flows/dt=2026-11-29/hour=10/c1-b-" + a + "-" + b + ".parquet", "c1", false},
		{"p/flows/dt=2026-11-29/hour=10/c1-b-" + a + "-" + b + ".parquet", "c1-b", true},
		{"p/flows/c1-" + a + "-" + b + "-.parquet", "c1", false},
		{"p/flows/c1-" + a + "-" + b + "-x.parquet", "c1", false},
		{"p/flows/c1-" + a + "-" + b + ".parquet.tmp", "c1", false},
		{"p/flows/c1-" + a + b + ".parquet", "c1", false},
		{"p/flows/c1-" + a[:19] + "-" + b + ".parquet", "c1", false},
		{"p/flows/c1-" + a + "-" + b + "0.parquet", "c1", false},
		{"p/c1-" + a + "-" + b + ".parquet/x", "c1", false},
		{"", "c1", false},
	} {
		if got := ownFile(tc.key, tc.writer); got != tc.want {
			t.Errorf("ownFile(%q, %q) = %v, want %v", tc.key, tc.writer, got, tc.want)
		}
	}
}
