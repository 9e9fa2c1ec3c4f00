package obs

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestOperatorActionsSameHostOnly: POST /-/… answers the host itself
// (loopback, or a client dialling the host's own address) and refuses any
// other peer, since metrics.listen may be opened to a remote Prometheus.
func TestOperatorActionsSameHostOnly(t *testing.T) {
	tests := []struct {
		name, remote, local string
		want                int
	}{
		{"loopback v4", "127.0.0.1:40000", "127.0.0.1:9464", http.StatusOK},
		{"loopback v6", "[::1]:40000", "[::1]:9464", http.StatusOK},
		{"host dials its own address", "10.0.0.5:40000", "10.0.0.5:9464", http.StatusOK},
		{"another host", "10.0.0.9:40000", "10.0.0.5:9464", http.StatusForbidden},
		{"another host, v4-mapped", "[::ffff:10.0.0.9]:40000", "[::ffff:10.0.0.5]:9464", http.StatusForbidden},
		{"no local address", "10.0.0.9:40000", "", http.StatusForbidden},
	}
	h := sameHostOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/-/inventory/confirm", nil)
			r.RemoteAddr = tc.remote
			if tc.local != "" {
				addr, err := net.ResolveTCPAddr("tcp", tc.local)
				if err != nil {
					t.Fatal(err)
				}
				r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(addr)))
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Errorf("status = %d, want %d (%s)", w.Code, tc.want, w.Body.String())
			}
		})
	}
}

// TestListenGuardsOnlyExtras: /metrics stays open to any peer; the
// operator actions get the guard (a real listener on loopback answers).
func TestListenGuardsOnlyExtras(t *testing.T) {
	called := false
	srv, err := Listen("127.0.0.1:0", NewRegistry(), ServerOptions{Extra: map[string]http.Handler{
		"/-/refresh": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { called = true }),
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	resp, err := http.Post("http://"+srv.Addr()+"/-/refresh", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !called {
		t.Fatalf("POST /-/refresh from loopback: status %d, handler called %v", resp.StatusCode, called)
	}
}
