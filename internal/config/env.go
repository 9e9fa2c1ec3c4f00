package config

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/internal/yamlpath"
)

// envNameRE is what ${NAME} accepts: a shell variable name.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expansion is the result of expandEnv: the text to decode and the values
// put in, so no error message shows them (one may be a secret).
type expansion struct {
	data   []byte
	values map[string]string // value → "${NAME}", for redact
	lines  map[int]string    // line number → its text before expansion, where a value was put in
}

// expandEnv replaces ${NAME} and ${NAME:-default} in the config text with
// the environment's values (lookup), before YAML parsing. $${ is a literal
// ${. Comments are left alone. Every unset variable without a default, a
// malformed reference and a value with a line break (it would change the
// YAML structure, not just the value) is an error naming the variable and
// its line; all of them are reported.
func expandEnv(data []byte, lookup func(string) (string, bool)) (expansion, error) {
	exp := expansion{values: map[string]string{}, lines: map[int]string{}}
	if !strings.Contains(string(data), "${") {
		exp.data = data
		return exp, nil
	}
	var paths map[int]string // built on the first problem
	var e units.Errors
	problem := func(line int, msg, fix string) {
		if paths == nil {
			paths = yamlpath.ByLine(data)
		}
		at := "line " + strconv.Itoa(line)
		if p := paths[line]; p != "" {
			e.Add(p, msg+" ("+at+")", fix)
			return
		}
		e.Add(at, msg, fix)
	}
	lines := strings.SplitAfter(string(data), "\n")
	var out strings.Builder
	for i, line := range lines {
		n := i + 1
		body, comment := splitComment(line)
		for {
			j := strings.Index(body, "${")
			if j < 0 {
				break
			}
			if j > 0 && body[j-1] == '$' { // $${ is a literal ${
				out.WriteString(body[:j-1] + "${")
				body = body[j+2:]
				continue
			}
			out.WriteString(body[:j])
			k := strings.IndexByte(body[j:], '}')
			if k < 0 {
				problem(n, "unterminated ${", "close it: ${NAME} or ${NAME:-default}; write $${ for a literal ${")
				body = ""
				break
			}
			ref := body[j+2 : j+k]
			body = body[j+k+1:]
			name, def, hasDef := strings.Cut(ref, ":-")
			if !envNameRE.MatchString(name) {
				problem(n, fmt.Sprintf("${%s}: not a variable name", ref), "use ${NAME} or ${NAME:-default} with NAME of letters, digits and _")
				continue
			}
			v, ok := lookup(name)
			fromEnv := ok && (v != "" || !hasDef) // ${NAME:-x}: x when NAME is unset or empty
			if !fromEnv {
				if !hasDef {
					problem(n, fmt.Sprintf("${%s} is not set", name), fmt.Sprintf("export %s, or give a default: ${%s:-value}", name, name))
					continue
				}
				v = def
			}
			if strings.ContainsAny(v, "\r\n") {
				problem(n, fmt.Sprintf("${%s} holds a line break", name), "a value must be one line; put multi-line secrets in a file and name the file")
				continue
			}
			if fromEnv && v != "" {
				exp.values[v] = "${" + name + "}"
				exp.lines[n] = strings.TrimRight(line, "\r\n")
			}
			out.WriteString(v)
		}
		out.WriteString(body + comment)
	}
	exp.data = []byte(out.String())
	return exp, e.Err()
}

// splitComment splits a YAML line before its comment: a # at the start or
// after a blank, outside quotes.
func splitComment(line string) (body, comment string) {
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i], line[i:]
		}
	}
	return line, ""
}

// yamlValueRE is how yaml.v3 quotes a value it could not store (cut to
// a prefix with "..." when long).
var yamlValueRE = regexp.MustCompile("`[^`]*`")

// hideYAMLValue rewrites a decoder message about line n: when a value
// from the environment went into that line, the value yaml quotes becomes
// the line's text before expansion (e.g. ${NAME}).
func (x expansion) hideYAMLValue(n int, msg string) string {
	orig, ok := x.lines[n]
	if !ok {
		return msg
	}
	if _, v, found := strings.Cut(orig, ": "); found {
		orig = v
	}
	return yamlValueRE.ReplaceAllLiteralString(msg, "`"+strings.TrimSpace(orig)+"`")
}

// redact replaces every value expandEnv put in by its ${NAME} in the
// problems of err: config errors quote bad values, and a value from the
// environment may be a password.
func (x expansion) redact(err error) error {
	if err == nil || len(x.values) == 0 {
		return err
	}
	vals := make([]string, 0, len(x.values))
	for v := range x.values {
		vals = append(vals, v)
	}
	sort.Slice(vals, func(i, j int) bool { return len(vals[i]) > len(vals[j]) }) // longest first
	hide := func(s string) string {
		for _, v := range vals {
			s = strings.ReplaceAll(s, v, x.values[v])
		}
		return s
	}
	var out units.Errors
	for _, one := range unwrapAll(err) {
		var fe *units.FieldError
		if errors.As(one, &fe) {
			out.Add(fe.Path, hide(fe.Problem), hide(fe.Fix))
			continue
		}
		out.Merge("", errors.New(hide(one.Error())))
	}
	return out.Err()
}
