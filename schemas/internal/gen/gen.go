// Package gen renders the Go code that package schemas derives from the
// column table (schemas/columns): the record struct and its column-wise
// Arrow encode/decode loops. The generated file is committed; a test in
// package schemas fails when it is stale (run `make generate`).
package gen

import (
	"bytes"
	"fmt"
	"go/format"
	"slices"
	"text/template"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Render returns the formatted source of one table's generated file
// (t.File in package schemas).
func Render(t columns.Table) ([]byte, error) {
	var buf bytes.Buffer
	groups, err := groupsOf(t, binForms[t.Type])
	if err != nil {
		return nil, err
	}
	ident, err := identityOf(t, grouped(groups))
	if err != nil {
		return nil, err
	}
	err = tmpl.Execute(&buf, struct {
		Type    string
		Schema  string
		Columns []columns.Column
		Bin     binForm
		Groups  []group
		Grouped map[int]bool
		Ident   map[int]string
	}{t.Type, t.Name, t.Columns, binForms[t.Type], groups, grouped(groups), ident})
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", t.Type, err)
	}
	out, err := format.Source(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("format %s: %w\n%s", t.Type, err, buf.Bytes())
	}
	return out, nil
}

// binForm is a record type's binary working block (schemas/bin.go): a
// struct field the column table does not know (no column, no schema
// change) and, per string column, the stringColumn call that writes the
// column's text from it. The encoder takes them when the block is Valid.
type binForm struct {
	Field, Type string
	Add         map[string]string // column name → call on the column, r.<Field> in scope as b
	// Key: column name → its dictGroup key in the binary form (columns
	// of a group that have an Add).
	Key map[string]string
}

var binForms = map[string]binForm{
	"Flow": {Field: "Bin", Type: "FlowBin", Add: map[string]string{
		"vm_mac": "addMAC(b.VMMAC)", "peer_mac": "addMAC(b.PeerMAC)", "src_ip": "addIP(b.SrcIP)", "dst_ip": "addIP(b.DstIP)",
	}, Key: map[string]string{"vm_mac": "macKey(b.VMMAC)", "peer_mac": "macKey(b.PeerMAC)"}},
}

// identity is the role of each record-identity column: a batch's
// encoder writes them from the batch's Identity (one agent, one sequence
// number, the row's position) instead of reading every row, so the
// publisher stamps nothing. Encoding rows without an Identity reads the
// fields.
var identity = map[string]struct {
	role string
	kind columns.Kind
}{
	"agent_id":     {"agent", columns.String},
	"batch_seq":    {"seq", columns.Int64},
	"record_index": {"index", columns.Int32},
}

// identityOf maps the column index of each identity column of t to its
// role; an identity column may not be in a dictionary group.
func identityOf(t columns.Table, grouped map[int]bool) (map[int]string, error) {
	out := map[int]string{}
	for i, c := range t.Columns {
		id, ok := identity[c.Name]
		if !ok {
			continue
		}
		if c.Kind != id.kind || grouped[i] || (c.Kind == columns.String && !c.Dict) {
			return nil, fmt.Errorf("render %s: identity column %s must be a %v column outside dictionary groups", t.Type, c.Name, id.kind)
		}
		out[i] = id.role
	}
	if len(out) != 0 && len(out) != len(identity) {
		return nil, fmt.Errorf("render %s: has %d of the %d identity columns", t.Type, len(out), len(identity))
	}
	return out, nil
}

// dictGroups are, per record type, dictionary columns whose values
// travel together (schemas/dictgroup.go): the encoder finds all keys of a
// group with one lookup. A VM's own columns, then the far end's and the
// attribution outcome's.
var dictGroups = map[string][][]string{
	"Flow": {
		{"node", "ifname", "vm_mac", "tenant_id", "server_id", "port_id"},
		{"zone", "peer_tenant_id", "external_network", "lb_id", "pool_id", "member_id", "lb_tap"},
	},
}

// groupMax is schemas.groupMax.
const groupMax = 7

type group struct {
	Members []member
}

type member struct {
	I              int // column index
	GoName         string
	BinAdd, BinKey string // binary form, when the column has one
}

func groupsOf(t columns.Table, bin binForm) ([]group, error) {
	var out []group
	for _, names := range dictGroups[t.Type] {
		if len(names) > groupMax {
			return nil, fmt.Errorf("render %s: group %v is wider than %d", t.Type, names, groupMax)
		}
		var g group
		for _, name := range names {
			i := slices.IndexFunc(t.Columns, func(c columns.Column) bool { return c.Name == name })
			if i < 0 || !t.Columns[i].Dict || t.Columns[i].Kind != columns.String {
				return nil, fmt.Errorf("render %s: group column %s is not a dictionary column", t.Type, name)
			}
			if (bin.Add[name] == "") != (bin.Key[name] == "") {
				return nil, fmt.Errorf("render %s: group column %s has a binary add without a key or the reverse", t.Type, name)
			}
			g.Members = append(g.Members, member{I: i, GoName: t.Columns[i].GoName, BinAdd: bin.Add[name], BinKey: bin.Key[name]})
		}
		out = append(out, g)
	}
	return out, nil
}

func grouped(gs []group) map[int]bool {
	m := map[int]bool{}
	for _, g := range gs {
		for _, c := range g.Members {
			m[c.I] = true
		}
	}
	return m
}

var tmpl = template.Must(template.New("gen").Funcs(template.FuncMap{
	"gotype": func(k columns.Kind) string {
		switch k {
		case columns.String:
			return "string"
		case columns.Int32:
			return "int32"
		default:
			return "int64"
		}
	},
	"ptag": func(c columns.Column) string {
		tag := c.Name
		if c.Kind == columns.Timestamp {
			tag += ",timestamp(microsecond)"
		}
		if c.Dict {
			tag += ",dict"
		}
		if c.Delta {
			tag += ",delta"
		}
		return tag
	},
	"isTimestamp": func(k columns.Kind) bool { return k == columns.Timestamp },
	"isString":    func(k columns.Kind) bool { return k == columns.String },
	"isInt32":     func(k columns.Kind) bool { return k == columns.Int32 },
	"isInt64":     func(k columns.Kind) bool { return k == columns.Int64 },
	"binAdd":      func(f binForm, name string) string { return f.Add[name] },
}).Parse(`// Code generated by schemas/internal/schemagen from schemas/columns; DO NOT EDIT.

package schemas

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// {{.Type}} is one {{.Schema}} record. Field order, names and types follow the
// column table in schemas/columns; see docs/schema.md.
type {{.Type}} struct {
{{- range .Columns}}
	// {{.GoName}}: {{.Doc}}.
	{{.GoName}} {{gotype .Kind}} ` + "`" + `parquet:"{{ptag .}}" json:"{{.Name}}"` + "`" + `
{{- end}}
{{- if .Bin.Field}}
	// {{.Bin.Field}} is the binary working form ({{.Bin.Type}}); no column.
	{{.Bin.Field}} {{.Bin.Type}} ` + "`" + `parquet:"-" json:"-"` + "`" + `
{{- end}}
}

// encode{{.Type}}Columns turns records into one wire column per column, in
// column order. One pass over the records fills every column (the structs
// are large: a pass per column would stream them through the cache {{len .Columns}}
// times); fixed-width columns are plain slices wrapped without copying.
{{- if .Ident}}
// With id the identity columns come from it (the rows' fields are not
// read); without, from the rows.
{{- end}}
func encode{{.Type}}Columns(recs []{{.Type}}, id *Identity, form wireForm, a *colArena) []wireColumn {
	n := len(recs)
{{- range $i, $c := .Columns}}
{{- if and (isString $c.Kind) $c.Addr}}
	var c{{$i}} ipColumn
	c{{$i}}.reset(n, form, a)
{{- else if and (isString $c.Kind) $c.Dict}}
	var c{{$i}} dictColumn
	c{{$i}}.reset(n, form, a)
{{- else if isString $c.Kind}}
	var c{{$i}} stringColumn
	c{{$i}}.resetIn(a, n, 16)
{{- else if isInt32 $c.Kind}}
	c{{$i}} := a.int32s(n)
{{- else}}
	c{{$i}} := a.int64s(n)
{{- end}}
{{- end}}
{{- range $g, $_ := .Groups}}
	var g{{$g}} dictGroup
	g{{$g}}.reset({{len .Members}}, form)
{{- end}}
	for i := range recs {
		r := &recs[i]
{{- if .Bin.Field}}
		b := &r.{{.Bin.Field}}
{{- end}}
{{- range $i, $c := .Columns}}
{{- if index $.Grouped $i}}
{{- else if index $.Ident $i}}
{{- else if binAdd $.Bin $c.Name}}
{{- else if isString $c.Kind}}
		c{{$i}}.add(r.{{$c.GoName}})
{{- else}}
		c{{$i}}[i] = r.{{$c.GoName}}
{{- end}}
{{- end}}
{{- if .Ident}}
		if id == nil {
{{- range $i, $c := .Columns}}
{{- if index $.Ident $i}}
{{- if isString $c.Kind}}
			c{{$i}}.add(r.{{$c.GoName}})
{{- else}}
			c{{$i}}[i] = r.{{$c.GoName}}
{{- end}}
{{- end}}
{{- end}}
		}
{{- end}}
{{- range $g, $grp := .Groups}}
		if g{{$g}}.on {
			var t [groupMax]groupKey
{{- range $j, $m := $grp.Members}}
{{- if $m.BinKey}}
			if b.Valid {
				t[{{$j}}] = {{$m.BinKey}}
			} else {
				t[{{$j}}] = strKey(r.{{$m.GoName}})
			}
{{- else}}
			t[{{$j}}] = strKey(r.{{$m.GoName}})
{{- end}}
{{- end}}
			if k := g{{$g}}.find(&t); k != nil {
{{- range $j, $m := $grp.Members}}
				c{{$m.I}}.keys = append(c{{$m.I}}.keys, k[{{$j}}])
{{- end}}
			} else {
				var k [groupMax]int32
{{- range $j, $m := $grp.Members}}
{{- if $m.BinAdd}}
				if b.Valid {
					k[{{$j}}] = c{{$m.I}}.{{$m.BinAdd}}
				} else {
					k[{{$j}}] = c{{$m.I}}.add(r.{{$m.GoName}})
				}
{{- else}}
				k[{{$j}}] = c{{$m.I}}.add(r.{{$m.GoName}})
{{- end}}
{{- end}}
				g{{$g}}.put(&t, &k)
			}
		} else {
{{- range $j, $m := $grp.Members}}
{{- if $m.BinAdd}}
			if b.Valid {
				c{{$m.I}}.{{$m.BinAdd}}
			} else {
				c{{$m.I}}.add(r.{{$m.GoName}})
			}
{{- else}}
			c{{$m.I}}.add(r.{{$m.GoName}})
{{- end}}
{{- end}}
		}
{{- end}}
{{- if .Bin.Field}}
		if b.Valid {
{{- range $i, $c := .Columns}}
{{- if not (index $.Grouped $i)}}
{{- with binAdd $.Bin $c.Name}}
			c{{$i}}.{{.}}
{{- end}}
{{- end}}
{{- end}}
		} else {
{{- range $i, $c := .Columns}}
{{- if index $.Grouped $i}}
{{- else if binAdd $.Bin $c.Name}}
			c{{$i}}.add(r.{{$c.GoName}})
{{- end}}
{{- end}}
		}
{{- end}}
	}
{{- range $g, $_ := .Groups}}
	g{{$g}}.release()
{{- end}}
{{- if .Ident}}
	if id != nil {
{{- range $i, $c := .Columns}}
{{- with index $.Ident $i}}
{{- if eq . "agent"}}
		c{{$i}}.fill(id.AgentID, n)
{{- else if eq . "seq"}}
		for i := range c{{$i}} {
			c{{$i}}[i] = id.BatchSeq
		}
{{- else}}
		for i := range c{{$i}} {
			c{{$i}}[i] = int32(i)
		}
{{- end}}
{{- end}}
{{- end}}
	}
{{- end}}
	return []wireColumn{
{{- range $i, $c := .Columns}}
{{- if isString $c.Kind}}
		c{{$i}}.column(),
{{- else if isInt32 $c.Kind}}
		int32Column(c{{$i}}),
{{- else if isTimestamp $c.Kind}}
		timestampColumn(c{{$i}}),
{{- else}}
		int64Column(c{{$i}}),
{{- end}}
{{- end}}
	}
}

// decode{{.Type}}Columns fills recs (len = rows) from the arrays of a record
// batch; idx maps each column of the table to its position in the batch.
// Each string column (utf8 or dictionary) is copied once into one Go
// string and the fields are slices of it: no allocation and no hashing
// per value. One pass over the
// records sets every field.
func decode{{.Type}}Columns(cols []arrow.Array, idx []int, recs []{{.Type}}) error {
{{- range $i, $c := .Columns}}
{{- if isString $c.Kind}}
	s{{$i}}, err := stringsOf("{{$c.Name}}", cols[idx[{{$i}}]], len(recs))
	if err != nil {
		return err
	}
{{- else if isInt32 $c.Kind}}
	a{{$i}}, ok := cols[idx[{{$i}}]].(*array.Int32)
	if !ok {
		return fmt.Errorf("column {{$c.Name}}: got %s, want int32", cols[idx[{{$i}}]].DataType())
	}
	v{{$i}} := a{{$i}}.Int32Values()
{{- else if isTimestamp $c.Kind}}
	a{{$i}}, ok := cols[idx[{{$i}}]].(*array.Timestamp)
	if !ok {
		return fmt.Errorf("column {{$c.Name}}: got %s, want timestamp[us]", cols[idx[{{$i}}]].DataType())
	}
	v{{$i}} := a{{$i}}.TimestampValues()
{{- else}}
	a{{$i}}, ok := cols[idx[{{$i}}]].(*array.Int64)
	if !ok {
		return fmt.Errorf("column {{$c.Name}}: got %s, want int64", cols[idx[{{$i}}]].DataType())
	}
	v{{$i}} := a{{$i}}.Int64Values()
{{- end}}
{{- end}}
	for i := range recs {
		r := &recs[i]
{{- range $i, $c := .Columns}}
{{- if isString $c.Kind}}
		r.{{$c.GoName}} = s{{$i}}.at(i)
{{- else if isTimestamp $c.Kind}}
		r.{{$c.GoName}} = int64(v{{$i}}[i])
{{- else}}
		r.{{$c.GoName}} = v{{$i}}[i]
{{- end}}
{{- end}}
{{- if .Bin.Field}}
		r.{{.Bin.Field}}.Valid = false // decoded records are text
{{- end}}
	}
	return nil
}
`))
