package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/internal/units"
)

// PasswordEnv holds the nats.user's password when nats.password_file is
// not set: an environment variable, never a flag (flags show in ps).
const PasswordEnv = "TAPFLOW_NATS_PASSWORD"

// TLSConfig is nats.tls: the client side of TLS to an external NATS.
type TLSConfig struct {
	// CAFile is a PEM bundle the server's certificate must chain to
	// (default: the system trust store). Setting any TLS key makes the
	// connection require TLS, also for a nats:// URL.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are this client's certificate and key (mutual
	// TLS); set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

func (t TLSConfig) enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// userName is what a NATS user name (and inbox prefix token) may hold.
var userName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// authMethods lists the authentication keys set, in config order.
func (c Config) authMethods() []string {
	var m []string
	if c.User != "" {
		m = append(m, "user")
	}
	if c.TokenFile != "" {
		m = append(m, "token_file")
	}
	if c.NkeySeedFile != "" {
		m = append(m, "nkey_seed_file")
	}
	if c.CredsFile != "" {
		m = append(m, "creds_file")
	}
	return m
}

// validateClientSecurity checks nats.tls and the authentication keys.
func (c Config) validateClientSecurity(e *units.Errors) {
	methods := c.authMethods()
	if len(methods) > 1 {
		e.Add(methods[1], "set together with nats."+methods[0],
			"use one authentication method: "+strings.Join(methods, " or "))
	}
	if len(methods) > 0 && urlHasUserinfo(c.URL) {
		e.Add("url", "carries user information and nats."+methods[0]+" is set",
			"remove the user, password or token from nats.url: secrets belong in nats.password_file, token_file, nkey_seed_file or creds_file")
	}
	if c.User != "" {
		if !userName.MatchString(c.User) {
			e.Add("user", fmt.Sprintf("%q: not a usable NATS user name", c.User), "use 1-64 letters, digits, - and _")
		}
		if c.PasswordFile == "" && os.Getenv(PasswordEnv) == "" {
			e.Add("password_file", "empty, and "+PasswordEnv+" is not set, with nats.user "+c.User,
				"point password_file at a file holding the password (chmod 600), or export "+PasswordEnv)
		}
	} else if c.PasswordFile != "" {
		e.Add("password_file", "set without nats.user", "set nats.user to the user the password belongs to")
	}
	for _, f := range []struct{ key, path string }{
		{"password_file", c.PasswordFile}, {"token_file", c.TokenFile},
		{"nkey_seed_file", c.NkeySeedFile}, {"creds_file", c.CredsFile}, {"tls.key_file", c.TLS.KeyFile},
	} {
		if f.path != "" {
			if err := checkSecretFile(f.path); err != nil {
				e.Add(f.key, err.Error(), secretFix(f.path, err))
			}
		}
	}
	for _, f := range []struct{ key, path string }{{"tls.ca_file", c.TLS.CAFile}, {"tls.cert_file", c.TLS.CertFile}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				e.Add(f.key, err.Error(), "point it at a readable PEM file")
			}
		}
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		e.Add("tls", "cert_file and key_file must be set together", "set both for mutual TLS, or neither")
	}
	if c.InboxPrefix != "" {
		if strings.ContainsAny(c.InboxPrefix, "*> \t") || strings.HasSuffix(c.InboxPrefix, ".") || strings.HasPrefix(c.InboxPrefix, ".") {
			e.Add("inbox_prefix", fmt.Sprintf("%q: not a subject prefix", c.InboxPrefix), "use dot-separated tokens without wildcards, e.g. _INBOX.agent-node1")
		}
	}
}

// errWorldReadable marks a secret file anyone on the host can read.
var errWorldReadable = errors.New("readable by every user on the host")

// checkSecretFile refuses a missing, non-regular or world-accessible
// secret: a password other users can read is not a secret.
func checkSecretFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", path)
	}
	if st.Mode().Perm()&0o007 != 0 {
		return fmt.Errorf("%s: mode %04o, %w", path, st.Mode().Perm(), errWorldReadable)
	}
	return nil
}

func secretFix(path string, err error) string {
	if errors.Is(err, errWorldReadable) {
		return "run: chmod 600 " + path + " (or chmod 640 and chgrp it to tapflow's group)"
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "create it, or point the key at the file that holds the secret"
	}
	return "point it at a readable regular file"
}

// urlHasUserinfo reports whether any URL of a comma-separated list
// carries user:password@ or token@.
func urlHasUserinfo(urls string) bool {
	return urls != "" && redact(urls) != urls
}

// readSecret reads a one-line secret file, trimming the line end.
func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("nats.%s: %w", key, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("nats.%s: %s is empty", key, path)
	}
	return s, nil
}

// securityOptions turns nats.tls and the authentication keys into
// nats.go options, reading the secret files now (a rotated password is
// picked up at the next start).
func securityOptions(cfg Config) ([]nats.Option, error) {
	var opts []nats.Option
	if cfg.TLS.enabled() {
		tc, err := clientTLS(cfg.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	switch {
	case cfg.User != "":
		pw := os.Getenv(PasswordEnv)
		if cfg.PasswordFile != "" {
			var err error
			if pw, err = readSecret("password_file", cfg.PasswordFile); err != nil {
				return nil, err
			}
		}
		opts = append(opts, nats.UserInfo(cfg.User, pw))
	case cfg.TokenFile != "":
		tok, err := readSecret("token_file", cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Token(tok))
	case cfg.NkeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NkeySeedFile)
		if err != nil {
			// nkeys errors never quote the seed.
			return nil, fmt.Errorf("nats.nkey_seed_file %s: %w", cfg.NkeySeedFile, err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if p := cfg.inboxPrefix(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	return opts, nil
}

// inboxPrefix is where this client's replies (publish acks, fetched
// messages) arrive: per user, so a least-privilege user's subscribe
// permission can be narrowed to its own replies (docs/security.md).
func (c Config) inboxPrefix() string {
	if c.InboxPrefix != "" {
		return c.InboxPrefix
	}
	if c.User != "" {
		return "_INBOX." + c.User
	}
	return ""
}

func clientTLS(t TLSConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pool, err := loadCAs(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func loadCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

// who names the identity a connection authenticates as, for errors: the
// user or the file, never a secret.
func (c Config) who() string {
	switch {
	case c.User != "":
		return fmt.Sprintf("user %q", c.User)
	case c.TokenFile != "":
		return "the token in " + c.TokenFile
	case c.NkeySeedFile != "":
		return "the nkey in " + c.NkeySeedFile
	case c.CredsFile != "":
		return "the credentials in " + c.CredsFile
	case urlHasUserinfo(c.URL):
		return "the user or token in nats.url"
	}
	return "no credentials"
}

// CheckFlagURL refuses a --nats-url carrying a password or token: a
// command line is visible to every user in ps.
func CheckFlagURL(u string) error {
	if urlHasUserinfo(u) {
		return fmt.Errorf("%s carries a password or token, which every user on the host sees in ps: set nats.user with nats.password_file (or %s), or nats.token_file, in the config file instead", redact(u), PasswordEnv)
	}
	return nil
}
