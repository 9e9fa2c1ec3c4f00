package inventory

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Collections lists the top-level keys of an inventory file, in the order
// the builder reads them.
var Collections = []string{"projects", "networks", "subnets", "ports", "routers", "floatingips", "servers", "loadbalancers", "amphorae", "pools", "trunks"}

// Parse reads an inventory from YAML or JSON (JSON is read as YAML). name
// is used in errors only. An error names the collection, the object (index
// and id) and the field.
func Parse(data []byte, name string) (*Inventory, error) {
	if inv, err := readStream(bytes.NewReader(data)); err == nil {
		return inv, nil
	}
	return parseWhole(data, name)
}

// parseWhole is Parse through one node tree of the whole document: every
// layout YAML allows, and the errors.
func parseWhole(data []byte, name string) (*Inventory, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("inventory %s: %s", name, cleanYAMLError(err))
	}
	inv := &Inventory{}
	// An empty document is what a file being written, or cut short at 0
	// bytes, looks like: accepting it as an empty cloud would turn every
	// port into a ghost. A cloud that is really empty is written "{}".
	if len(root.Content) == 0 || (root.Content[0].Kind == yaml.ScalarNode && root.Content[0].Tag == "!!null") {
		return nil, fmt.Errorf("inventory %s: %w: no collections (a truncated or half-written file?); write the whole inventory, or {} for a cloud that is really empty", name, ErrEmpty)
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("inventory %s: line %d: top level must be a mapping of collections (%s)", name, doc.Line, strings.Join(Collections, ", "))
	}
	var errs []error
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if err := decodeCollection(inv, doc.Content[i], doc.Content[i+1]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("inventory %s: %w", name, err)
	}
	inv.intern(newInterner())
	return inv, nil
}

// decodeCollection decodes one top-level key k and its value v into inv.
func decodeCollection(inv *Inventory, k, v *yaml.Node) error {
	var err error
	switch k.Value {
	case "projects":
		inv.Projects, err = decodeList(v, k.Value, func(o *Project) string { return o.ID })
	case "networks":
		inv.Networks, err = decodeList(v, k.Value, func(o *Network) string { return o.ID })
	case "subnets":
		inv.Subnets, err = decodeList(v, k.Value, func(o *Subnet) string { return o.ID })
	case "ports":
		inv.Ports, err = decodeList(v, k.Value, func(o *Port) string { return o.ID })
	case "routers":
		inv.Routers, err = decodeList(v, k.Value, func(o *Router) string { return o.ID })
	case "floatingips":
		inv.FloatingIPs, err = decodeList(v, k.Value, func(o *FloatingIP) string { return o.ID })
	case "servers":
		inv.Servers, err = decodeList(v, k.Value, func(o *Server) string { return o.ID })
	case "loadbalancers":
		inv.LoadBalancers, err = decodeList(v, k.Value, func(o *LoadBalancer) string { return o.ID })
	case "amphorae":
		inv.Amphorae, err = decodeList(v, k.Value, func(o *Amphora) string { return o.ID })
	case "pools":
		inv.Pools, err = decodeList(v, k.Value, func(o *Pool) string { return o.ID })
		if err == nil {
			err = checkMembers(inv.Pools)
		}
	case "trunks":
		inv.Trunks, err = decodeList(v, k.Value, func(o *Trunk) string { return o.ID })
		if err == nil {
			err = checkTrunks(inv.Trunks)
		}
	default:
		err = fmt.Errorf("line %d: unknown collection %q; known: %s", k.Line, k.Value, strings.Join(Collections, ", "))
	}
	return err
}

// ErrEmpty marks an inventory file with no content at all.
var ErrEmpty = errors.New("empty inventory")

// Load reads and parses the inventory file at path. A file in the layout
// inventory dump writes is read in pieces, never whole.
func Load(path string) (*Inventory, error) {
	inv, _, err := load(path)
	return inv, err
}

// load is Load, also returning the SHA-256 of the content parsed (zero
// when the file could not be read).
func load(path string) (*Inventory, [32]byte, error) {
	var sum [32]byte
	f, err := os.Open(path)
	if err != nil {
		return nil, sum, fmt.Errorf("load inventory %s: %w", path, err)
	}
	h := sha256.New()
	inv, serr := readStream(io.TeeReader(f, h))
	f.Close()
	if serr == nil {
		h.Sum(sum[:0])
		return inv, sum, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, sum, fmt.Errorf("load inventory %s: %w", path, err)
	}
	sum = sha256.Sum256(data)
	inv, err = parseWhole(data, path)
	return inv, sum, err
}

// hashFile is the SHA-256 of the file at path, read in pieces.
func hashFile(path string) ([32]byte, error) {
	var sum [32]byte
	f, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}

// decodeList decodes a sequence of objects one by one, so that an error
// names the object and, by decoding the failing object field by field, the
// field. Every object needs a non-empty, unique id.
func decodeList[T any](n *yaml.Node, coll string, id func(*T) string) ([]T, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: line %d: must be a list of objects", coll, n.Line)
	}
	out := make([]T, len(n.Content))
	seen := make(map[string]int, len(n.Content))
	var errs []error
	for i, item := range n.Content {
		where := fmt.Sprintf("%s[%d]", coll, i)
		if item.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Errorf("%s: line %d: must be an object", where, item.Line))
			continue
		}
		if v := scalarField(item, "id"); v != "" {
			where += fmt.Sprintf(" (id %s)", v)
		}
		if err := item.Decode(&out[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s", where, fieldError[T](item, err)))
			continue
		}
		oid := id(&out[i])
		if oid == "" {
			errs = append(errs, fmt.Errorf("%s: line %d: id: missing; every object needs the id the API gave it", where, item.Line))
			continue
		}
		if j, dup := seen[oid]; dup {
			errs = append(errs, fmt.Errorf("%s: line %d: id: duplicate of %s[%d]", where, item.Line, coll, j))
			continue
		}
		seen[oid] = i
	}
	return out, errors.Join(errs...)
}

// fieldError finds the first field of item that does not decode into a T,
// and describes the problem as "field: line N: problem".
func fieldError[T any](item *yaml.Node, whole error) string {
	for i := 0; i+1 < len(item.Content); i += 2 {
		one := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: item.Content[i : i+2]}
		var t T
		if err := one.Decode(&t); err != nil {
			return item.Content[i].Value + ": " + cleanYAMLError(err)
		}
	}
	return cleanYAMLError(whole)
}

func scalarField(m *yaml.Node, key string) string {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key && m.Content[i+1].Kind == yaml.ScalarNode {
			return m.Content[i+1].Value
		}
	}
	return ""
}

func checkMembers(pools []Pool) error {
	var errs []error
	for i := range pools {
		seen := map[string]bool{}
		for j, m := range pools[i].Members {
			if m.ID == "" {
				errs = append(errs, fmt.Errorf("pools[%d] (id %s): members[%d]: id: missing", i, pools[i].ID, j))
			} else if seen[m.ID] {
				errs = append(errs, fmt.Errorf("pools[%d] (id %s): members[%d] (id %s): id: duplicate", i, pools[i].ID, j, m.ID))
			}
			seen[m.ID] = true
		}
	}
	return errors.Join(errs...)
}

// checkTrunks rejects what cannot be attributed: a trunk without a parent
// port, a subport without port or with a VLAN id outside 1–4094, a VLAN
// used twice in one trunk.
func checkTrunks(trunks []Trunk) error {
	var errs []error
	for i := range trunks {
		tr := &trunks[i]
		if tr.PortID == "" {
			errs = append(errs, fmt.Errorf("trunks[%d] (id %s): port_id: missing; name the parent port", i, tr.ID))
		}
		seen := map[int]bool{}
		for j, sp := range tr.SubPorts {
			where := fmt.Sprintf("trunks[%d] (id %s): sub_ports[%d]", i, tr.ID, j)
			switch {
			case sp.PortID == "":
				errs = append(errs, fmt.Errorf("%s: port_id: missing", where))
			case sp.SegmentationType != "" && sp.SegmentationType != "vlan" && sp.SegmentationType != "inherit":
				errs = append(errs, fmt.Errorf("%s (port %s): segmentation_type %q: use vlan", where, sp.PortID, sp.SegmentationType))
			case sp.SegmentationType == "inherit":
				// the VLAN is the network's segment, not known here: the
				// snapshot skips the subport (anomaly trunk_skipped)
			case sp.SegmentationID < 1 || sp.SegmentationID > 4094:
				errs = append(errs, fmt.Errorf("%s (port %s): segmentation_id %d: use a VLAN id 1–4094", where, sp.PortID, sp.SegmentationID))
			case seen[sp.SegmentationID]:
				errs = append(errs, fmt.Errorf("%s (port %s): segmentation_id %d: used twice in the trunk", where, sp.PortID, sp.SegmentationID))
			}
			seen[sp.SegmentationID] = true
		}
	}
	return errors.Join(errs...)
}

func cleanYAMLError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "yaml: unmarshal errors:\n")
	s = strings.TrimPrefix(s, "yaml: ")
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// File is the static inventory provider: it re-reads one file when its
// content changes. A file that does not parse is reported once and the
// caller keeps its last good inventory.
type File struct {
	path     string
	lastHash [32]byte
	loaded   bool
}

// NewFile returns a provider for path. It does not read the file.
func NewFile(path string) (*File, error) {
	if path == "" {
		return nil, errors.New("inventory file: path is empty")
	}
	return &File{path: path}, nil
}

// Path is the file this provider reads.
func (f *File) Path() string { return f.path }

// Poll reads the file and returns a new inventory when its content differs
// from the last content Poll saw, changed=false when it is the same. A file
// that does not parse returns the error once per distinct content; the next
// Poll with that same content returns (nil, false, nil). Not safe for
// concurrent use.
func (f *File) Poll() (inv *Inventory, changed bool, err error) {
	// hash first: an unchanged file (every poll but a few) is not parsed
	h, err := hashFile(f.path)
	if err != nil {
		return nil, false, fmt.Errorf("load inventory %s: %w", f.path, err)
	}
	if f.loaded && h == f.lastHash {
		return nil, false, nil
	}
	inv, h, err = load(f.path)
	if err != nil && h == ([32]byte{}) {
		return nil, false, err // not read at all
	}
	if f.loaded && h == f.lastHash {
		return nil, false, nil // replaced by the previous content meanwhile
	}
	f.lastHash, f.loaded = h, true
	if err != nil {
		return nil, false, err
	}
	return inv, true, nil
}
