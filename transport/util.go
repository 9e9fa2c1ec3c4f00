package transport

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
)

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, port, nil
}

// redact hides the user information (user:password, token) of every URL
// in a comma-separated NATS URL list before it reaches a log or an error,
// with or without a scheme and whether or not the URL parses: everything
// before the last '@' of the authority becomes REDACTED.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		scheme := ""
		if k := strings.Index(p, "://"); k >= 0 {
			scheme, p = p[:k+3], p[k+3:]
		}
		if at := strings.LastIndex(p, "@"); at >= 0 {
			p = "REDACTED@" + p[at+1:]
		}
		parts[i] = scheme + p
	}
	return strings.Join(parts, ",")
}

// checkURLs reports what is wrong with a comma-separated NATS URL list
// (nats.url): each entry is [scheme://][user[:password]@]host[:port] with
// scheme nats, tls, ws or wss. Problems name the URL redacted.
func checkURLs(urls string) []string {
	var problems []string
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		shown := redact(raw)
		if raw == "" {
			problems = append(problems, "empty entry in the comma-separated list")
			continue
		}
		s := raw
		if !strings.Contains(s, "://") {
			s = "nats://" + s // nats.go reads a URL without scheme as nats://
		}
		u, err := url.Parse(s)
		if err != nil {
			// url errors quote the input: say what is wrong without it.
			problems = append(problems, fmt.Sprintf("%q: does not parse as a URL", shown))
			continue
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			problems = append(problems, fmt.Sprintf("%q: scheme %q, want nats, tls, ws or wss", shown, u.Scheme))
			continue
		}
		if u.Hostname() == "" {
			problems = append(problems, fmt.Sprintf("%q: no host", shown))
			continue
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				problems = append(problems, fmt.Sprintf("%q: port %q is not 1-65535", shown, p))
			}
		} else if strings.HasSuffix(u.Host, ":") {
			problems = append(problems, fmt.Sprintf("%q: empty port", shown))
		}
		if u.Path != "" && u.Path != "/" {
			problems = append(problems, fmt.Sprintf("%q: unexpected path %q", shown, u.Path))
		}
	}
	return problems
}

// slogAdapter routes nats-server's logger into slog.
type slogAdapter struct{ l *slog.Logger }

func (a *slogAdapter) Noticef(f string, v ...any) { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Warnf(f string, v ...any)   { a.l.Warn(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Fatalf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Errorf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Debugf(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Tracef(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...)) }
