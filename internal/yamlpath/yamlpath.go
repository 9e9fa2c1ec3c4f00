// Package yamlpath maps the nodes of a YAML document to dotted paths
// ("collector.roll_size", "servers[2].ports[0]") and back to lines, so
// config and topology errors can name the field instead of a line number.
package yamlpath

import (
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Lines returns the line each path starts on: mapping keys and sequence
// elements. A document that does not parse gives an empty map.
func Lines(data []byte) map[string]int {
	out := map[string]int{}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return out
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				out[p] = n.Content[i].Line
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := path + "[" + strconv.Itoa(i) + "]"
				out[p] = c.Line
				walk(c, p)
			}
		}
	}
	walk(&doc, "")
	return out
}

// ByLine inverts Lines: the deepest path starting on each line (a key and
// its scalar value share a line; a flow sequence's elements share one: then
// the first of them).
func ByLine(data []byte) map[int]string {
	out := map[int]string{}
	for p, l := range Lines(data) {
		// Equal depth (a flow sequence's elements): the smallest path, so
		// the answer does not depend on map order.
		if cur, ok := out[l]; !ok || len(p) > len(cur) || (len(p) == len(cur) && p < cur) {
			out[l] = p
		}
	}
	return out
}
