package main

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tapflow/tapflow/internal/config"
)

// configKeyRE matches "<section>.<key>" for the config file's sections:
// a config key, or a file name (inventory.yaml; see fileExts).
var configKeyRE = regexp.MustCompile(`\b(?:synthetic|capture|inventory|attribution|agent|nats|collector|metrics|log)(?:\.[a-z0-9_]+)+\b`)

// fileExts end file names that look like config keys.
var fileExts = []string{"md", "yaml", "yml", "json", "parquet", "csv", "txt"}

// configKeyExists reports whether the dotted path names a field of
// config.Config by its yaml tags (inline sections flattened; a map
// accepts any key below it).
func configKeyExists(path string) bool {
	t := reflect.TypeFor[config.Config]()
	for _, seg := range strings.Split(path, ".") {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Map:
			return true
		case reflect.Struct:
		default:
			return false // a leaf with more path below it
		}
		f, ok := yamlField(t, seg)
		if !ok {
			return false
		}
		t = f
	}
	return true
}

// yamlField finds the field of struct t with yaml name name, looking into
// inline fields.
func yamlField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case tag == "-" || !f.IsExported():
		case strings.Contains(f.Tag.Get("yaml"), ",inline"):
			if ft, ok := yamlField(f.Type, name); ok {
				return ft, true
			}
		case tag == name:
			return f.Type, true
		}
	}
	return nil, false
}

// helpTexts returns every text a command shows: short, long, example and
// its flags' usage lines.
func helpTexts(c *cobra.Command) []string {
	texts := []string{c.Short, c.Long, c.Example}
	add := func(f *pflag.Flag) { texts = append(texts, f.Usage) }
	c.LocalFlags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	return texts
}

// TestHelpConfigKeysExist: every config key a command's help names
// ("agent.batch_timeout" was named, and never existed) is a key of the
// config file.
func TestHelpConfigKeysExist(t *testing.T) {
	for _, c := range []struct {
		key  string
		want bool
	}{
		{"collector.agent_id_is_node", true}, // inline consumer section
		{"collector.poison_deliveries", true},
		{"collector.early_commit_share", true},
		{"collector.roll_age", true}, // inline parquet section
		{"agent.spool.max_bytes", true},
		{"synthetic.batch_max_age", true},
		{"agent.batch_timeout", false},
		{"capture.active_timeout.x", false},
	} {
		if got := configKeyExists(c.key); got != c.want {
			t.Errorf("configKeyExists(%q) = %v, want %v", c.key, got, c.want)
		}
	}
	seen := 0
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		for _, text := range helpTexts(c) {
			for _, key := range configKeyRE.FindAllString(text, -1) {
				if ext := key[strings.LastIndexByte(key, '.')+1:]; slices.Contains(fileExts, ext) {
					continue // docs/inventory.md, inventory.yaml
				}
				seen++
				if !configKeyExists(key) {
					t.Errorf("%s help names %s, which is not a config key (docs/config.md)", path, key)
				}
			}
		}
		for _, sub := range c.Commands() {
			walk(sub, path+" "+sub.Name())
		}
	}
	walk(newRoot(), "tapflow")
	// The help texts name dozens of keys; a pattern that matched none
	// would check nothing.
	if seen < 20 {
		t.Fatalf("only %d config keys found in the help texts", seen)
	}
	if !slices.Contains(configKeyRE.FindAllString(tapLong, -1), "capture.active_timeout") {
		t.Errorf("tap --help does not name capture.active_timeout")
	}
}
