// Package units holds the typed config values shared by every component:
// byte sizes ("128MiB") and durations ("5m") that parse from YAML and report
// a bad value with the fix, plus FieldErrors, the way every Config.Validate
// reports problems with their path.
package units

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ByteSize is a size in bytes. In YAML it is an integer or a number with a
// unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
// 1024), e.g. "128MiB".
type ByteSize int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseByteSize parses "128MiB", "1.5GB", "4096".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || t == "" {
		return 0, fmt.Errorf("%q: not a size; use e.g. 128MiB", s)
	}
	return ByteSize(f * float64(mult)), nil
}

func (b ByteSize) String() string {
	v := int64(b)
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.m && v%u.m == 0 {
			return fmt.Sprintf("%d%s", v/u.m, u.s)
		}
	}
	return fmt.Sprintf("%dB", v)
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return typeError(n, err.Error())
	}
	*b = v
	return nil
}

// typeError makes the YAML decoder collect the problem (with its line) and
// go on, so one run reports every bad value instead of the first.
func typeError(n *yaml.Node, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, msg)}}
}

// MarshalYAML implements yaml.Marshaler.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// Duration is a time.Duration that reads "5m", "10s", "1h30m" from YAML.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		return typeError(n, fmt.Sprintf("%q: not a duration; use e.g. 30s or 5m", n.Value))
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// FieldError is one invalid config field: its dotted path, the problem and
// how to fix it.
type FieldError struct {
	Path    string // e.g. "collector.roll_size"
	Problem string // e.g. `"12x": not a size`
	Fix     string // e.g. "use e.g. 128MiB"
}

func (e *FieldError) Error() string {
	if e.Fix == "" {
		return e.Path + ": " + e.Problem
	}
	return e.Path + ": " + e.Problem + "; " + e.Fix
}

// Errors collects FieldErrors during validation.
type Errors struct{ list []error }

// Add records a problem with the field at path.
func (e *Errors) Add(path, problem, fix string) {
	e.list = append(e.list, &FieldError{Path: path, Problem: problem, Fix: fix})
}

// Merge adds every error of err (joined or single), prefixing FieldError
// paths with prefix + ".".
func (e *Errors) Merge(prefix string, err error) {
	if err == nil {
		return
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for _, one := range errs {
		var fe *FieldError
		if errors.As(one, &fe) && prefix != "" {
			e.list = append(e.list, &FieldError{Path: prefix + "." + fe.Path, Problem: fe.Problem, Fix: fe.Fix})
			continue
		}
		e.list = append(e.list, one)
	}
}

// Err returns all collected errors joined, or nil.
func (e *Errors) Err() error { return errors.Join(e.list...) }
