// Package obs builds the process-wide logger and metrics registry and
// serves Prometheus metrics, liveness (/healthz), readiness (/readyz) and,
// when enabled, pprof.
package obs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a slog logger writing format ("json" or "text") at level.
func NewLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// Server serves /metrics, /healthz, /readyz and, when enabled, pprof.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// ServerOptions are what Listen mounts besides /metrics and /healthz.
type ServerOptions struct {
	// Ready answers /readyz; nil: /readyz is always ready.
	Ready *Readiness
	// Pprof mounts net/http/pprof under /debug/pprof/ (metrics.pprof).
	Pprof bool
	// Extra are operator actions (POST /-/refresh, …), same host only.
	Extra map[string]http.Handler
}

// Listen binds addr (so a port clash fails at start, not later).
// /healthz is liveness (the process serves HTTP); /readyz is readiness
// (opts.Ready). Extra handlers (operator actions such as POST /-/refresh)
// are mounted next to /metrics and answer only connections from the host
// itself: metrics.listen may be opened to a Prometheus elsewhere, which
// must not be able to apply a held-back inventory or force Neutron polls.
func Listen(addr string, reg *Registry, opts ServerOptions) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w (set metrics.listen to a free address, or \"\" to disable)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if opts.Ready != nil {
		mux.Handle("/readyz", opts.Ready)
	} else {
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ready\n") })
	}
	if opts.Pprof {
		// Mounted explicitly: net/http/pprof's init registers on
		// http.DefaultServeMux, which nothing here serves.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	for path, h := range opts.Extra {
		mux.Handle(path, sameHostOnly(h))
	}
	return &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(sctx)
	}()
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// sameHostOnly refuses a request that does not come from this host: the
// peer is a loopback address or the very address it connected to (a
// client on the host dialling the host's own IP).
func sameHostOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromSameHost(r) {
			http.Error(w, "operator actions are accepted from this host only; run the tapflow command on the host", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func fromSameHost(r *http.Request) bool {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	if peer.Addr().IsLoopback() {
		return true
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	l, err := netip.ParseAddrPort(local.String())
	return err == nil && l.Addr().Unmap() == peer.Addr().Unmap()
}
