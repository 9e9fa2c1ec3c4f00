package units

import (
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestParseByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want ByteSize
		ok   bool
	}{
		{"128MiB", 128 << 20, true}, {"1.5GB", 1_500_000_000, true}, {"4096", 4096, true},
		{" 64 KiB ", 64 << 10, true}, {"1G", 1 << 30, true}, {"12x", 0, false}, {"", 0, false}, {"-1MiB", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseByteSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestYAMLRoundTripAndErrors(t *testing.T) {
	var v struct {
		S ByteSize `yaml:"s"`
		D Duration `yaml:"d"`
	}
	if err := yaml.Unmarshal([]byte("s: 2MiB\nd: 90s\n"), &v); err != nil || v.S != 2<<20 || v.D.D().Seconds() != 90 {
		t.Fatalf("got %+v, %v", v, err)
	}
	out, _ := yaml.Marshal(v)
	if string(out) != "s: 2MiB\nd: 1m30s\n" {
		t.Fatalf("marshal: %q", out)
	}
	err := yaml.Unmarshal([]byte("s: lots\nd: soon\n"), &v)
	te, ok := err.(*yaml.TypeError)
	if !ok || len(te.Errors) != 2 {
		t.Fatalf("want both bad values reported, got %v", err)
	}
}

func TestErrorsMergePrefixesPaths(t *testing.T) {
	var inner Errors
	inner.Add("roll_size", "bad", "fix it")
	var outer Errors
	outer.Merge("collector", inner.Err())
	if got := outer.Err().Error(); got != "collector.roll_size: bad; fix it" {
		t.Fatalf("got %q", got)
	}
}
