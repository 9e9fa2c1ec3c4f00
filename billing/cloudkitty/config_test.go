package cloudkitty

import (
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/units"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid; else a part of the error
	}{
		{"default", DefaultConfig(), ""},
		{"zero", Config{}, ""},
		{"public interface", Config{Interface: "public"}, ""},
		{"endpoint", Config{Endpoint: "https://cloudkitty.example:8889"}, ""},
		{"bad interface", Config{Interface: "internl"}, "billing.cloudkitty.interface \"internl\""},
		{"negative timeout", Config{Timeout: units.Duration(-time.Second)}, "timeout is negative"},
		{"endpoint without scheme", Config{Endpoint: "cloudkitty.example:8889"}, "want an http(s) URL"},
		{"endpoint with credentials", Config{Endpoint: "http://u:secret@cloudkitty.example"}, "without credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error with %q, got %v", tc.want, err)
			case err != nil && strings.Contains(err.Error(), "secret"):
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

func TestNewValidatesAndContactsNothing(t *testing.T) {
	if _, err := New(Config{Interface: "x"}, nil); err == nil {
		t.Fatal("New accepted an invalid config")
	}
	c, err := New(Config{Endpoint: "http://127.0.0.1:9"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.sc != nil {
		t.Fatal("New authenticated already")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
