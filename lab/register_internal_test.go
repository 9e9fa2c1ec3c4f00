package lab

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/vishvananda/netns"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// TestBind: what OpenStack made replaces the derived ids, MACs and
// addresses, and every name and reference derived from them follows.
func TestBind(t *testing.T) {
	data, err := os.ReadFile("../deploy/lab/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	topo, err := ParseTopology(data, "demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Resolve(topo, "tfb")
	if err != nil {
		t.Fatal(err)
	}
	web1 := c.Server("web1").Ports[0]
	lb := c.LB("web-lb")
	amp := lb.Amphorae[0]
	rt := c.Router("acme-router")
	acme := c.Project("acme")
	net := c.Network("web")
	reg := &Registration{IDs: map[string]string{
		acme.ID:             "11111111111111111111111111111111",
		net.ID:              "aaaaaaaa-1111-4111-8111-111111111111",
		rt.ID:               "bbbbbbbb-2222-4222-8222-222222222222",
		lb.ID:               "cccccccc-3333-4333-8333-333333333333",
		c.Server("web1").ID: "dddddddd-4444-4444-8444-444444444444",
	}, Ports: map[string]BoundPort{
		web1.ID:       {ID: "eeeeeeee-5555-4555-8555-555555555555", MAC: "fa:16:3e:12:34:56", IPs: []string{"10.0.1.11", "fd00:1::11"}},
		lb.VIPPort.ID: {ID: "ffffffff-6666-4666-8666-666666666666", MAC: "fa:16:3e:00:00:01", IPs: []string{"10.0.1.100"}},
		amp.VRRP.ID:   {ID: "12345678-7777-4777-8777-777777777777", MAC: "fa:16:3e:00:00:02", IPs: []string{"10.0.1.7"}},
	}, Amphorae: map[string]BoundAmphora{amp.ID: {ID: "99999999-8888-4888-8888-888888888888", ComputeID: "abcdefab-9999-4999-8999-999999999999", Role: "BACKUP"}}}
	if err := c.Bind(reg); err != nil {
		t.Fatal(err)
	}
	checks := []struct{ what, got, want string }{
		{"project id", acme.ID, "11111111111111111111111111111111"},
		{"bridge", net.Bridge, "brqaaaaaaaa-11"},
		{"tap", web1.HostDev, "tapeeeeeeee-55"},
		{"tap mac", web1.MAC.String(), "fa:16:3e:12:34:56"},
		{"server port device_id", web1.DeviceID, "dddddddd-4444-4444-8444-444444444444"},
		{"router interface device_id", rt.Ifaces[0].DeviceID, rt.ID},
		{"router interface dev", rt.Ifaces[0].Dev, "qr-" + rt.Ifaces[0].ID[:11]},
		{"VIP device_id", lb.VIPPort.DeviceID, "lb-cccccccc-3333-4333-8333-333333333333"},
		{"VIP", lb.VIP.String(), "10.0.1.100"},
		{"amphora compute", amp.Ports[0].DeviceID, "abcdefab-9999-4999-8999-999999999999"},
		{"amphora role", amp.Role, "BACKUP"},
		{"VRRP address", amp.VRRP.V4().String(), "10.0.1.7"},
		{"VRRP tap", amp.VRRP.HostDev, "tap12345678-77"},
		{"VRRP name", amp.VRRP.Name, "octavia-lb-vrrp-99999999-8888-4888-8888-888888888888"},
		{"VRRP allowed pair", amp.VRRP.AddrPairs[0].String(), "10.0.1.100"},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %q, want %q", ck.what, ck.got, ck.want)
		}
	}
	if ip := web1.IPs[1]; ip.Addr != netip.MustParseAddr("fd00:1::11") || !ip.Subnet.Prefix.Contains(ip.Addr) {
		t.Errorf("web1 IPv6 %v not bound to its subnet", ip)
	}
	if p := c.PortByTap("tapeeeeeeee-55"); p != web1 {
		t.Error("PortByTap does not find the bound tap")
	}
	// An address in no subnet of the port's network is refused.
	bad := &Registration{Ports: map[string]BoundPort{c.Server("web2").Ports[0].ID: {ID: "x", MAC: "fa:16:3e:00:00:03", IPs: []string{"192.0.2.1"}}}}
	if err := c.Bind(bad); err == nil || !strings.Contains(err.Error(), "in no subnet of network web") {
		t.Errorf("Bind with a foreign address = %v", err)
	}
}

// TestRegisterOptionsErrors: bad or missing credentials are named before
// any request.
func TestRegisterOptionsErrors(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	full := map[string]string{"OS_USERNAME": "admin", "OS_PASSWORD": "pw", "OS_PROJECT_NAME": "admin"}
	cases := []struct {
		name, url string
		env       map[string]string
		want      string
	}{
		{"no url", "", full, "no Keystone URL"},
		{"not a url", "keystone:5000", full, "is not Keystone's URL"},
		{"no password", "http://127.0.0.1:5000/v3", map[string]string{"OS_USERNAME": "admin", "OS_PROJECT_NAME": "admin"}, "OS_PASSWORD not set"},
		{"nothing", "http://127.0.0.1:5000/v3", nil, "OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME not set"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := RegisterOptions{AuthURL: tc.url, Getenv: env(tc.env)}.authOptions()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	ao, eo, err := RegisterOptions{AuthURL: "http://127.0.0.1:5000/v3", Getenv: env(full)}.authOptions()
	if err != nil || ao.DomainID != "default" || ao.Scope.ProjectName != "admin" || eo.Availability != "internal" {
		t.Errorf("defaults: %+v %+v %v", ao, eo, err)
	}
}

// TestRegisterKeystoneDown: an unreachable Keystone is named as such,
// not as bad credentials.
func TestRegisterKeystoneDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	env := map[string]string{"OS_USERNAME": "admin", "OS_PASSWORD": "pw", "OS_PROJECT_NAME": "admin"}
	_, err = dialOpenStack(t.Context(), RegisterOptions{AuthURL: "http://" + addr + "/v3", Getenv: func(k string) string { return env[k] }})
	if err == nil || !strings.Contains(err.Error(), "cannot reach Keystone") {
		t.Errorf("dial a closed port = %v, want \"cannot reach Keystone\"", err)
	}
}

// TestForwardLoopback: a server on the host's 127.0.0.1 answers a client
// in another namespace through the forwarder (root).
func TestForwardLoopback(t *testing.T) {
	prereq.Root(t, "to create a network namespace")
	ns := "tffwd" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // echo
		}
	}()
	f, err := forwardLoopback(ns, []string{srv.Addr().String(), "192.0.2.1:80"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.lns) != 1 {
		t.Errorf("%d listeners, want 1 (only loopback addresses are forwarded)", len(f.lns))
	}
	// Dial from inside the namespace.
	done := make(chan string, 1)
	go func() {
		runtime.LockOSThread() // this thread ends in the namespace; never unlocked
		h, err := netns.GetFromName(ns)
		if err != nil || netns.Set(h) != nil {
			done <- "enter namespace failed"
			return
		}
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			done <- "dial: " + err.Error()
			return
		}
		defer c.Close()
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		done <- string(b)
	}()
	if got := <-done; got != "ping" {
		t.Errorf("echo through the forwarder = %q, want ping", got)
	}
}

// TestUnregisterRetriesTransient: lab down asks again when Neutron
// answers DELETE with a 500 (CI saw it on a loaded SQLite testbed) or a
// 409, and gives up at once on an answer that will not change (403).
// The stand-in answers exactly as neutron-server does at the boundary.
func TestUnregisterRetriesTransient(t *testing.T) {
	neutron500 := `{"NeutronError": {"type": "HTTPInternalServerError", "message": "Request Failed: internal server error while processing your request.", "detail": ""}}`
	tests := []struct {
		name      string
		answers   []int // status per attempt; the last one repeats
		wantErr   bool
		wantCalls int
	}{
		{"500 then deleted", []int{500, 500, 204}, false, 3},
		{"500 then already gone", []int{500, 404}, false, 2},
		{"409 while ports go", []int{409, 204}, false, 2},
		{"403 is not retried", []int{403}, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				i := min(calls, len(tc.answers)-1)
				calls++
				mu.Unlock()
				if r.Method != http.MethodDelete || r.URL.Path != "/v2.0/networks/n1" {
					http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
					return
				}
				code := tc.answers[i]
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				if code >= 400 {
					io.WriteString(w, neutron500)
				}
			}))
			t.Cleanup(srv.Close)
			pc := &gophercloud.ProviderClient{HTTPClient: *srv.Client()}
			api := &osAPI{neutron: &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: srv.URL + "/", ResourceBase: srv.URL + "/v2.0/"}}
			reg := &Registration{Created: []Created{{Kind: "network", ID: "n1", Name: "globex-net"}}}
			err := unregister(context.Background(), api, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if (err != nil) != tc.wantErr {
				t.Fatalf("unregister: err = %v, want error %v", err, tc.wantErr)
			}
			if calls != tc.wantCalls {
				t.Errorf("DELETE calls = %d, want %d", calls, tc.wantCalls)
			}
		})
	}
}

// TestPostRetrying: a create answered with a 500 is posted again, or
// adopted when it was made anyway; a 400 is returned at once.
func TestPostRetrying(t *testing.T) {
	tests := []struct {
		name      string
		answers   []error // per post; the last one repeats
		exists    bool    // what find reports after a failure
		wantErr   bool
		wantPosts int
	}{
		{"500 then created", []error{code(500), nil}, false, false, 2},
		{"500 but made anyway", []error{code(500)}, true, false, 1},
		{"400 is not retried", []error{code(400)}, false, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			posts := 0
			post := func() error {
				err := tc.answers[min(posts, len(tc.answers)-1)]
				posts++
				return err
			}
			find := func() (bool, error) { return tc.exists, nil }
			err := postRetrying(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), "floating IP", post, find)
			if (err != nil) != tc.wantErr || posts != tc.wantPosts {
				t.Fatalf("err = %v, posts = %d; want error %v, posts %d", err, posts, tc.wantErr, tc.wantPosts)
			}
		})
	}
}

func code(n int) error {
	return fmt.Errorf("POST floatingips: %w", gophercloud.ErrUnexpectedResponseCode{Actual: n})
}

// TestRegisterPortsErrors: RegisterPorts refuses, before any API call, a
// lab that is not registered, an unknown server and a server whose ports
// are all in OpenStack already.
func TestRegisterPortsErrors(t *testing.T) {
	data, err := os.ReadFile("../deploy/lab/basic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, server string
		registered   bool
		want         string
	}{
		{"not registered", "vm3", false, "needs a lab brought up with --register"},
		{"no such server", "vm9", true, `no server "vm9"`},
		{"every port registered", "vm1", true, "no port left out of OpenStack"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(data, "basic.yaml", Options{Prefix: "check", StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			if tc.registered {
				l.reg = &Registration{IDs: map[string]string{}}
				l.opts.Register = &RegisterOptions{AuthURL: "http://127.0.0.1:1/v3"} // never dialled
			}
			_, err = l.RegisterPorts(context.Background(), tc.server)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RegisterPorts(%s) = %v, want %q", tc.server, err, tc.want)
			}
		})
	}
}
