package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestNATSURLFlagWithSecretRefused: a password or token in --nats-url is
// visible to every user in ps: every command refuses it, names the config
// keys to use instead, and does not echo the secret.
func TestNATSURLFlagWithSecretRefused(t *testing.T) {
	const secret = "hunter2-s3cr3t"
	for _, args := range [][]string{
		{"agent", "--nats-url", "nats://agent:" + secret + "@h:4222"},
		{"collector", "--nats-url", "agent:" + secret + "@h:4222"},
		{"run", "--nats-url", "tls://" + secret + "@h:4222"},
		{"dlq", "inspect", "--nats-url", "nats://h1:4222,u:" + secret + "@h2:4222"},
	} {
		t.Run(strings.Join(args[:len(args)-1], " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != exitUsage {
				t.Fatalf("exit %d, want %d: %s", code, exitUsage, errb.String())
			}
			for _, want := range []string{"ps", "REDACTED@", "nats.password_file"} {
				if !strings.Contains(errb.String(), want) {
					t.Errorf("stderr lacks %q: %s", want, errb.String())
				}
			}
			if strings.Contains(out.String()+errb.String(), secret) {
				t.Fatalf("secret echoed: %s", errb.String())
			}
		})
	}
}
