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

// redact hides passwords and tokens in NATS URLs before they reach logs.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		u.User = url.User("REDACTED")
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// slogAdapter routes nats-server's logger into slog.
type slogAdapter struct{ l *slog.Logger }

func (a *slogAdapter) Noticef(f string, v ...any) { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Warnf(f string, v ...any)   { a.l.Warn(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Fatalf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Errorf(f string, v ...any)  { a.l.Error(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Debugf(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a *slogAdapter) Tracef(f string, v ...any)  { a.l.Debug(fmt.Sprintf(f, v...)) }
