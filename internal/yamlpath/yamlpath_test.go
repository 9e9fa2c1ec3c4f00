package yamlpath

import "testing"

func TestLinesAndByLine(t *testing.T) {
	doc := []byte("node: a\ncollector:\n  roll_size: 12x\nservers:\n  - name: x\n    ports:\n      - id: p\n")
	lines := Lines(doc)
	want := map[string]int{"node": 1, "collector": 2, "collector.roll_size": 3, "servers": 4, "servers[0]": 5, "servers[0].name": 5, "servers[0].ports[0].id": 7}
	for p, l := range want {
		if lines[p] != l {
			t.Errorf("Lines[%q] = %d, want %d", p, lines[p], l)
		}
	}
	by := ByLine(doc)
	for l, p := range map[int]string{1: "node", 3: "collector.roll_size", 5: "servers[0].name", 7: "servers[0].ports[0].id"} {
		if by[l] != p {
			t.Errorf("ByLine[%d] = %q, want %q", l, by[l], p)
		}
	}
	if len(Lines([]byte("a: [\n"))) != 0 {
		t.Error("broken YAML gave paths")
	}
}
