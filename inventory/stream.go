package inventory

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"

	"go.yaml.in/yaml/v3"
)

// The YAML library builds a node tree of the whole document before it
// decodes a value (about 5 KB per port of a dump), so a large file is read
// here in pieces instead: the file in the block layout inventory dump
// writes (a top-level key per collection, its objects as a block sequence)
// is cut at the objects' "- " lines and decoded a batch of objects at a
// time. Whatever does not fit that layout, and every error, goes to Parse's
// whole-document path, which gives the same result and the precise
// message; so the fast path only ever has to be right about what it
// accepts (FuzzParse compares the two).

// errSlow sends a document to the whole-document path.
var errSlow = errors.New("inventory: not in the streamed layout")

// streamBatch is how many objects one YAML call decodes.
const streamBatch = 256

// maxLine bounds one line of the streamed layout; a longer line sends the
// file to the whole-document path.
const maxLine = 1 << 20

// readStream decodes the block layout from r; errSlow (or any error) means
// "use Parse on the whole document".
func readStream(r io.Reader) (*Inventory, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	inv := &Inventory{}
	in := newInterner()
	seenColl := map[string]bool{}
	var line []byte
	var err error
	next := func() bool {
		line, err = readLine(br)
		return err == nil
	}
	more := next()
	for more {
		if blankOrComment(line) {
			if !yamlOK(line) {
				return nil, errSlow
			}
			more = next()
			continue
		}
		key, inline, ok := topKey(line)
		if !ok || seenColl[key] || (!inline && !yamlOK(line)) {
			return nil, errSlow
		}
		seenColl[key] = true
		if inline {
			// key: value on one line (and continuation lines): small,
			// decoded as one piece
			chunk := append([]byte(nil), line...)
			for more = next(); more && (blankOrComment(line) || indentOf(line) > 0); more = next() {
				chunk = append(chunk, line...)
			}
			if err := decodeInline(inv, in, key, chunk); err != nil {
				return nil, errSlow
			}
			continue
		}
		c := newCollector(inv, in, key)
		itemIndent := -1
		var batch []byte
		n := 0
		flush := func() error {
			if n == 0 {
				if !yamlOK(batch) {
					return errSlow
				}
				return nil
			}
			err := c.decode(batch, n)
			batch, n = batch[:0], 0
			return err
		}
		for more = next(); more; more = next() {
			if blankOrComment(line) {
				batch = append(batch, line...)
				continue
			}
			ind := indentOf(line)
			if itemIndent < 0 {
				if ind == 0 && !isItemStart(line, ind) {
					break // "key:" alone: null, no objects
				}
				if !isItemStart(line, ind) {
					return nil, errSlow
				}
				itemIndent = ind
			}
			if ind > itemIndent {
				batch = append(batch, line...)
				continue
			}
			if ind == itemIndent && isItemStart(line, ind) {
				if n == streamBatch {
					if err := flush(); err != nil {
						return nil, errSlow
					}
				}
				batch = append(batch, line...)
				n++
				continue
			}
			if ind == 0 {
				break // the next top-level key
			}
			return nil, errSlow
		}
		if err := flush(); err != nil {
			return nil, errSlow
		}
		if err := c.finish(); err != nil {
			return nil, errSlow
		}
	}
	if !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(seenColl) == 0 {
		return nil, errSlow // empty, null or not a mapping: Parse says which
	}
	if checkMembers(inv.Pools) != nil || checkTrunks(inv.Trunks) != nil {
		return nil, errSlow
	}
	return inv, nil
}

// readLine returns the next line with its newline; io.EOF after the last.
func readLine(br *bufio.Reader) ([]byte, error) {
	l, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		full := append([]byte(nil), l...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(full) > maxLine {
				return nil, errSlow
			}
			l, err = br.ReadSlice('\n')
			full = append(full, l...)
		}
		l = full
	}
	if len(l) > 0 && errors.Is(err, io.EOF) {
		// A last line without its newline: a newline added here would
		// become part of a block scalar ending the document ("|" keeps
		// one), so such a file is read whole instead (FuzzParse).
		if !blankOrComment(l) {
			return nil, errSlow
		}
		l, err = append(l, '\n'), nil
	}
	if bytes.IndexByte(l, '\t') >= 0 && indentHasTab(l) || otherBreak(l) {
		return nil, errSlow
	}
	return l, err
}

// otherBreak: YAML also breaks lines at a lone CR, NEL, LS and PS, which
// the pieces, cut at LF, would not see.
func otherBreak(l []byte) bool {
	if i := bytes.IndexByte(l, '\r'); i >= 0 && i != len(l)-2 {
		return true
	}
	return bytes.Contains(l, []byte("\u0085")) || bytes.Contains(l, []byte("\u2028")) || bytes.Contains(l, []byte("\u2029"))
}

func indentHasTab(l []byte) bool {
	for _, c := range l {
		switch c {
		case ' ':
		case '\t':
			return true
		default:
			return false
		}
	}
	return false
}

func blankOrComment(l []byte) bool {
	t := bytes.TrimLeft(l, " ")
	return len(bytes.Trim(t, " \t\r\n")) == 0 || t[0] == '#'
}

// yamlOK: lines the pieces skip (comments, blank lines and keys between
// collections) must still be what YAML accepts (UTF-8, printable).
func yamlOK(l []byte) bool {
	if len(bytes.Trim(l, " \t\r\n")) == 0 {
		return true
	}
	var n yaml.Node
	return yaml.Unmarshal(l, &n) == nil
}

func indentOf(l []byte) int { return len(l) - len(bytes.TrimLeft(l, " ")) }

// isItemStart: "- ..." or a lone "-" at the line's indentation.
func isItemStart(l []byte, ind int) bool {
	t := l[ind:]
	return len(t) >= 2 && t[0] == '-' && (t[1] == ' ' || t[1] == '\n' || t[1] == '\r')
}

// topKey reads "collection:" at column 0; inline is true when a value
// follows on the line.
func topKey(l []byte) (key string, inline, ok bool) {
	i := bytes.IndexByte(l, ':')
	if i <= 0 {
		return "", false, false
	}
	k := string(l[:i])
	if !slices.Contains(Collections, k) {
		return "", false, false
	}
	rest := bytes.TrimSpace(l[i+1:])
	if len(l) > i+1 && l[i+1] != ' ' && l[i+1] != '\n' && l[i+1] != '\r' {
		return "", false, false
	}
	return k, len(rest) > 0 && rest[0] != '#', true
}

func decodeInline(inv *Inventory, in *interner, key string, chunk []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(chunk, &root); err != nil || len(root.Content) != 1 {
		return errSlow
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode || len(doc.Content) != 2 || doc.Content[0].Value != key {
		return errSlow
	}
	one := &Inventory{}
	if err := decodeCollection(one, doc.Content[0], doc.Content[1]); err != nil {
		return errSlow
	}
	one.intern(in)
	setCollection(inv, one, key)
	return nil
}

// collector appends one collection's objects, batch by batch.
type collector struct {
	inv    *Inventory
	in     *interner
	decode func(batch []byte, n int) error
	finish func() error
}

func newCollector(inv *Inventory, in *interner, key string) *collector {
	c := &collector{inv: inv, in: in}
	switch key {
	case "projects":
		c.decode, c.finish = batcher(&inv.Projects, func(o *Project) string { return o.ID }, in, func(o *Project) { in.project(o) })
	case "networks":
		c.decode, c.finish = batcher(&inv.Networks, func(o *Network) string { return o.ID }, in, func(o *Network) { in.network(o) })
	case "subnets":
		c.decode, c.finish = batcher(&inv.Subnets, func(o *Subnet) string { return o.ID }, in, func(o *Subnet) { in.subnet(o) })
	case "ports":
		c.decode, c.finish = batcher(&inv.Ports, func(o *Port) string { return o.ID }, in, func(o *Port) { in.port(o) })
	case "routers":
		c.decode, c.finish = batcher(&inv.Routers, func(o *Router) string { return o.ID }, in, func(o *Router) { in.router(o) })
	case "floatingips":
		c.decode, c.finish = batcher(&inv.FloatingIPs, func(o *FloatingIP) string { return o.ID }, in, func(o *FloatingIP) { in.floatingIP(o) })
	case "servers":
		c.decode, c.finish = batcher(&inv.Servers, func(o *Server) string { return o.ID }, in, func(o *Server) { in.server(o) })
	case "loadbalancers":
		c.decode, c.finish = batcher(&inv.LoadBalancers, func(o *LoadBalancer) string { return o.ID }, in, func(o *LoadBalancer) { in.loadBalancer(o) })
	case "amphorae":
		c.decode, c.finish = batcher(&inv.Amphorae, func(o *Amphora) string { return o.ID }, in, func(o *Amphora) { in.amphora(o) })
	case "pools":
		c.decode, c.finish = batcher(&inv.Pools, func(o *Pool) string { return o.ID }, in, func(o *Pool) { in.pool(o) })
	case "trunks":
		c.decode, c.finish = batcher(&inv.Trunks, func(o *Trunk) string { return o.ID }, in, func(o *Trunk) { in.trunk(o) })
	}
	return c
}

// batcher decodes batches of n objects into *dst, checking ids as
// decodeList does; finish trims the slice to its length.
func batcher[T any](dst *[]T, id func(*T) string, in *interner, intern func(*T)) (func([]byte, int) error, func() error) {
	seen := map[string]struct{}{}
	decode := func(batch []byte, n int) error {
		var root yaml.Node
		if err := yaml.Unmarshal(batch, &root); err != nil || len(root.Content) != 1 {
			return errSlow
		}
		seq := root.Content[0]
		if seq.Kind != yaml.SequenceNode || len(seq.Content) != n {
			return errSlow
		}
		for _, item := range seq.Content {
			if item.Kind != yaml.MappingNode {
				return errSlow
			}
			var o T
			if err := item.Decode(&o); err != nil {
				return errSlow
			}
			if id(&o) == "" {
				return errSlow
			}
			*dst = append(*dst, o)
		}
		// interned and packed where they stay (append may have moved
		// earlier objects, never these); ids are remembered packed, so
		// the decoder's copies can go
		for i := len(*dst) - n; i < len(*dst); i++ {
			intern(&(*dst)[i])
		}
		in.pack()
		for i := len(*dst) - n; i < len(*dst); i++ {
			oid := id(&(*dst)[i])
			if _, dup := seen[oid]; dup {
				return errSlow
			}
			seen[oid] = struct{}{}
		}
		return nil
	}
	finish := func() error {
		// "key:" with no objects is null, as in Parse; otherwise the exact
		// length (append's spare capacity would stay for the snapshot's life)
		if *dst != nil && cap(*dst) > len(*dst) {
			*dst = append(make([]T, 0, len(*dst)), *dst...)
		}
		return nil
	}
	return decode, finish
}

func setCollection(dst, src *Inventory, key string) {
	switch key {
	case "projects":
		dst.Projects = src.Projects
	case "networks":
		dst.Networks = src.Networks
	case "subnets":
		dst.Subnets = src.Subnets
	case "ports":
		dst.Ports = src.Ports
	case "routers":
		dst.Routers = src.Routers
	case "floatingips":
		dst.FloatingIPs = src.FloatingIPs
	case "servers":
		dst.Servers = src.Servers
	case "loadbalancers":
		dst.LoadBalancers = src.LoadBalancers
	case "amphorae":
		dst.Amphorae = src.Amphorae
	case "pools":
		dst.Pools = src.Pools
	case "trunks":
		dst.Trunks = src.Trunks
	}
}
