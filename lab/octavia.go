package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// upAmphorae plugs each amphora (management port, VIP-network port, one
// port per member network: the last ones carry no Octavia marker) and
// starts HAProxy on the VIP. ACTIVE_STANDBY pairs run keepalived with
// unicast VRRP between their base addresses, as Octavia configures it; a
// SINGLE amphora gets the VIP statically.
func (l *Lab) upAmphorae(ctx context.Context) error {
	for _, lb := range l.Cloud.LBs {
		for _, a := range lb.Amphorae {
			sysctls := append([]string{"net.ipv4.ip_nonlocal_bind=1"}, noIPv6...)
			sysctls = append(sysctls, noRPFilter...)
			if err := l.nsBase(ctx, a.NS, sysctls...); err != nil {
				return err
			}
			for _, p := range a.Ports {
				if err := l.plug(ctx, p, false); err != nil {
					return err
				}
			}
			if gw := lb.VIPSubnet.Gateway; gw.IsValid() {
				if err := l.ip(ctx, a.NS, "route", "add", "default", "via", gw.String(), "dev", a.VRRP.Dev); err != nil {
					return err
				}
			}
			cfg := filepath.Join(l.dir, "haproxy-"+a.Name+".cfg")
			if err := os.WriteFile(cfg, []byte(haproxyConfig(lb)), 0o644); err != nil {
				return fmt.Errorf("lab: %w", err)
			}
			if _, err := l.nsexec(ctx, a.NS, "haproxy", "-c", "-q", "-f", cfg); err != nil {
				return fmt.Errorf("haproxy rejects %s: %w", cfg, err)
			}
			if _, err := l.spawn(a.NS, "haproxy-"+a.Name, nil, "haproxy", "-db", "-f", cfg); err != nil {
				return err
			}
			if !lb.ActiveStandby {
				if err := l.ip(ctx, a.NS, "addr", "add", lb.VIP.String()+"/32", "dev", a.VRRP.Dev); err != nil {
					return err
				}
				continue
			}
			if err := l.startKeepalived(a); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *Lab) startKeepalived(a *Amphora) error {
	cfg := filepath.Join(l.dir, "keepalived-"+a.Name+".conf")
	if err := os.WriteFile(cfg, []byte(keepalivedConfig(a)), 0o644); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	base := filepath.Join(l.dir, "keepalived-"+a.Name)
	_, err := l.spawn(a.NS, "keepalived-"+a.Name, nil, "keepalived", "--dont-fork", "--log-console", "--log-detail", "--vrrp",
		"-f", cfg, "-p", base+".pid", "-r", base+"-vrrp.pid", "-c", base+"-checkers.pid")
	return err
}

func haproxyConfig(lb *LB) string {
	mode := strings.ToLower(lb.Protocol)
	var b strings.Builder
	fmt.Fprintf(&b, `# tapflow lab: amphora HAProxy of load balancer %s (%s)
global
    maxconn 4096

defaults
    mode %s
    timeout connect 5s
    timeout client 120s
    timeout server 120s

frontend %s
    bind %s:%d
    default_backend %s

backend %s
    balance roundrobin
`, lb.Name, lb.ID, mode, lb.ID, lb.VIP, lb.ListenPort, lb.PoolID, lb.PoolID)
	for _, m := range lb.Members {
		fmt.Fprintf(&b, "    server %s %s:%d\n", m.ID, m.Addr, m.ProtocolPort)
	}
	return b.String()
}

func keepalivedConfig(a *Amphora) string {
	lb := a.LB
	prio := 100
	if a.Role == "BACKUP" {
		prio = 90
	}
	var peers []string
	for _, o := range lb.Amphorae {
		if o != a {
			peers = append(peers, o.VRRP.V4().String())
		}
	}
	return fmt.Sprintf(`# tapflow lab: VRRP of amphora %s (load balancer %s)
global_defs {
    router_id %s
    vrrp_skip_check_adv_addr
    vrrp_garp_master_refresh 5
}

vrrp_instance %s {
    state %s
    interface %s
    virtual_router_id %d
    priority %d
    advert_int 1
    garp_master_delay 1
    unicast_src_ip %s
    unicast_peer {
        %s
    }
    virtual_ipaddress {
        %s
    }
}
`, a.Name, lb.Name, a.Name, "lb_"+strings.ReplaceAll(lb.ID[:8], "-", ""), a.Role, a.VRRP.Dev, lb.VRID, prio,
		a.VRRP.V4(), strings.Join(peers, "\n        "), lb.VIP)
}

// VIPHolder returns the amphora that has the VIP now, or nil.
func (l *Lab) VIPHolder(ctx context.Context, lb *LB) (*Amphora, error) {
	for _, a := range lb.Amphorae {
		out, err := l.out(ctx, "ip", "-n", a.NS, "-4", "-o", "addr", "show", "dev", a.VRRP.Dev)
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(out), " "+lb.VIP.String()+"/") {
			return a, nil
		}
	}
	return nil, nil
}

// WaitVIP waits until an amphora other than not holds the VIP.
func (l *Lab) WaitVIP(ctx context.Context, lb *LB, not *Amphora, timeout time.Duration) (*Amphora, error) {
	deadline := time.Now().Add(timeout)
	for {
		a, err := l.VIPHolder(ctx, lb)
		if err != nil {
			return nil, err
		}
		if a != nil && a != not {
			return a, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("load balancer %s: no amphora took VIP %s within %s (keepalived logs: %s)", lb.Name, lb.VIP, timeout,
				filepath.Join(l.dir, "logs", "keepalived-*.log"))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *Lab) waitListening(ctx context.Context, lb *LB, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	want := lb.VIP.String() + ":" + strconv.Itoa(lb.ListenPort)
	for _, a := range lb.Amphorae {
		for {
			out, err := l.nsexec(ctx, a.NS, "ss", "-Hltn")
			if err == nil && strings.Contains(string(out), want) {
				break
			}
			if l.exited("haproxy-" + a.Name) {
				return fmt.Errorf("haproxy of %s exited; its log:\n%s", a.Name, l.logTail("haproxy-"+a.Name))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("haproxy of %s is not listening on %s after %s (log: %s)", a.Name, want, timeout,
					filepath.Join(l.dir, "logs", "haproxy-"+a.Name+".log"))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Failover stops keepalived on the amphora holding the VIP of lb (as a
// failed MASTER would) and waits for the other one to take the VIP. It
// returns the old and the new holder.
func (l *Lab) Failover(ctx context.Context, lbName string) (from, to *Amphora, err error) {
	lb := l.Cloud.LB(lbName)
	if lb == nil {
		return nil, nil, fmt.Errorf("lab failover: no load balancer %q", lbName)
	}
	if !lb.ActiveStandby {
		return nil, nil, fmt.Errorf("lab failover: load balancer %s is SINGLE; failover needs topology: ACTIVE_STANDBY", lbName)
	}
	from, err = l.WaitVIP(ctx, lb, nil, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	n := 0
	for _, pid := range nsPids(from.NS) {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if strings.TrimSpace(string(comm)) == "keepalived" {
			syscall.Kill(pid, syscall.SIGTERM)
			n++
		}
	}
	if n == 0 {
		return nil, nil, fmt.Errorf("lab failover: no keepalived runs in %s", from.NS)
	}
	to, err = l.WaitVIP(ctx, lb, from, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	l.log.Info("lab failover", "lb", lb.Name, "from", from.Name, "to", to.Name)
	return from, to, nil
}
