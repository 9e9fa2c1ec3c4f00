package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/tapflow/tapflow/internal/units"
)

// Transfer is one transfer of exact payload size between named endpoints
// (docs/lab.md, "Endpoints").
type Transfer struct {
	From     string         `yaml:"from"`
	To       string         `yaml:"to"`
	Proto    string         `yaml:"proto"` // tcp (default), udp, http, icmp
	Bytes    units.ByteSize `yaml:"bytes"`
	Port     int            `yaml:"port"`     // default: the endpoint's service port
	Download bool           `yaml:"download"` // tcp/http: the far end sends
	Size     int            `yaml:"size"`     // udp datagram / icmp payload size (default 1000)
	Duration units.Duration `yaml:"duration"` // spread the payload over this long
}

func (t Transfer) String() string {
	dir := "→"
	if t.Download {
		dir = "←"
	}
	s := fmt.Sprintf("%s %s %s %s", t.From, dir, t.To, t.Bytes)
	if t.Proto != "" {
		s += " " + t.Proto
	}
	return s
}

func (t Transfer) proto() string {
	if t.Proto == "" {
		return "tcp"
	}
	return t.Proto
}

// target is a resolved transfer.
type target struct {
	ns    string // sender namespace
	to    string // host:port, or host for icmp
	proto string
}

// resolve finds the sender's namespace and the destination address.
func (l *Lab) resolve(t Transfer) (target, error) {
	c := l.Cloud
	tg := target{proto: t.proto()}
	switch tg.proto {
	case "tcp", "udp", "http", "icmp":
	default:
		return tg, fmt.Errorf("transfer %s: proto %q: use tcp, udp, http or icmp", t, t.Proto)
	}
	switch {
	case t.From == "internet":
		if c.Internet == nil {
			return tg, fmt.Errorf("transfer %s: the topology has no external network, so no internet", t)
		}
		tg.ns = c.Internet.NS
	default:
		s := c.Server(t.From)
		if s == nil {
			return tg, fmt.Errorf("transfer %s: from %q: not a server of the topology (or \"internet\")", t, t.From)
		}
		tg.ns = s.NS
	}
	addr, port, proto, err := l.endpoint(t.To, tg.proto)
	if err != nil {
		return tg, fmt.Errorf("transfer %s: to %q: %w", t, t.To, err)
	}
	if t.Proto == "" && proto != "" {
		tg.proto = proto
	}
	if t.Port != 0 {
		port = t.Port
	}
	if port == 0 {
		port = map[string]int{"tcp": TCPPort, "udp": TCPPort, "http": HTTPPort}[tg.proto]
	}
	if tg.proto == "icmp" {
		tg.to = addr.String()
	} else {
		tg.to = netip.AddrPortFrom(addr, uint16(port)).String()
	}
	return tg, nil
}

// endpoint resolves a destination name to an address, and the port and
// protocol it implies (0/"" when it implies none).
func (l *Lab) endpoint(name, proto string) (netip.Addr, int, string, error) {
	c := l.Cloud
	kind, arg, hasArg := strings.Cut(name, ":")
	if !hasArg {
		kind, arg = "", name
	}
	v6 := false
	if a, ok := strings.CutSuffix(arg, "/v6"); ok && kind != "ip" && kind != "mcast" {
		arg, v6 = a, true
	}
	pick := func(p *Port) (netip.Addr, error) {
		a := p.V4()
		if v6 {
			a = p.V6()
		}
		if !a.IsValid() {
			return a, fmt.Errorf("port %s has no %s address", p.ID, map[bool]string{true: "IPv6", false: "IPv4"}[v6])
		}
		return a, nil
	}
	switch kind {
	case "":
		if name == "internet" {
			if c.Internet == nil {
				return netip.Addr{}, 0, "", errors.New("the topology has no external network, so no internet")
			}
			return c.Internet.Addresses[0], 0, "", nil
		}
		if name == "metadata" {
			return netip.MustParseAddr(MetadataAddr), 80, "http", nil
		}
		srv, eth, _ := strings.Cut(arg, "/")
		s := c.Server(srv)
		if s == nil {
			return netip.Addr{}, 0, "", errors.New("not a server, and not internet, metadata, ip:, lb:, fip:, gateway:, dhcp:, mcast: or internet:N")
		}
		p := s.Ports[0]
		if eth != "" {
			i, err := strconv.Atoi(strings.TrimPrefix(eth, "eth"))
			if err != nil || i < 0 || i >= len(s.Ports) {
				return netip.Addr{}, 0, "", fmt.Errorf("server %s has no %s", s.Name, eth)
			}
			p = s.Ports[i]
		}
		a, err := pick(p)
		return a, 0, "", err
	case "internet":
		i, err := strconv.Atoi(arg)
		if c.Internet == nil || err != nil || i < 0 || i >= len(c.Internet.Addresses) {
			return netip.Addr{}, 0, "", errors.New("internet:N needs N < the number of internet.addresses")
		}
		return c.Internet.Addresses[i], 0, "", nil
	case "ip", "mcast":
		a, err := netip.ParseAddr(arg)
		if err != nil {
			return a, 0, "", err
		}
		if kind == "mcast" && !a.IsMulticast() {
			return a, 0, "", fmt.Errorf("%s is not a multicast group", a)
		}
		if kind == "mcast" {
			return a, 0, "udp", nil
		}
		return a, 0, "", nil
	case "lb":
		lb := c.LB(arg)
		if lb == nil {
			return netip.Addr{}, 0, "", fmt.Errorf("no load balancer %q", arg)
		}
		return lb.VIP, lb.ListenPort, strings.ToLower(lb.Protocol), nil
	case "fip":
		if lb := c.LB(arg); lb != nil {
			if lb.VIPPort.FIP == nil {
				return netip.Addr{}, 0, "", fmt.Errorf("load balancer %s has no floating_ip", arg)
			}
			return lb.VIPPort.FIP.Addr, lb.ListenPort, strings.ToLower(lb.Protocol), nil
		}
		s := c.Server(arg)
		if s == nil {
			return netip.Addr{}, 0, "", fmt.Errorf("no server or load balancer %q", arg)
		}
		for _, p := range s.Ports {
			if p.FIP != nil {
				return p.FIP.Addr, 0, "", nil
			}
		}
		return netip.Addr{}, 0, "", fmt.Errorf("server %s has no floating_ip", arg)
	case "gateway", "dhcp":
		n := c.Network(arg)
		if n == nil {
			return netip.Addr{}, 0, "", fmt.Errorf("no network %q", arg)
		}
		if kind == "dhcp" {
			if n.DHCP == nil {
				return netip.Addr{}, 0, "", fmt.Errorf("network %s has no dhcp: true", arg)
			}
			a, err := pick(n.DHCP)
			return a, DHCPPort, "udp", err
		}
		for _, sn := range n.Subnets {
			if sn.Gateway.IsValid() && sn.Gateway.Is6() == v6 {
				return sn.Gateway, 0, "", nil
			}
		}
		return netip.Addr{}, 0, "", fmt.Errorf("network %s has no gateway of that family", arg)
	}
	return netip.Addr{}, 0, "", fmt.Errorf("unknown endpoint kind %q", kind)
}

// Drive runs the transfers in parallel, each from inside its sender's
// namespace with the helper's `send`, and returns what each confirmed.
func (l *Lab) Drive(ctx context.Context, ts []Transfer) ([]SendResult, error) {
	tgs := make([]target, len(ts))
	for i, t := range ts {
		tg, err := l.resolve(t)
		if err != nil {
			return nil, err
		}
		tgs[i] = tg
	}
	res := make([]SendResult, len(ts))
	g, ctx := errgroup.WithContext(ctx)
	for i, t := range ts {
		tg := tgs[i]
		g.Go(func() error {
			args := []string{"send", "--proto", tg.proto, "--to", tg.to, "--bytes", strconv.FormatInt(int64(t.Bytes), 10)}
			if t.Download {
				args = append(args, "--download")
			}
			if t.Size > 0 {
				args = append(args, "--size", strconv.Itoa(t.Size))
			}
			if t.Duration > 0 {
				args = append(args, "--duration", t.Duration.D().String())
			}
			out, err := l.nsexecEnv(ctx, tg.ns, l.opts.Helper.Env, l.opts.Helper.argv(args...)...)
			if err != nil {
				return fmt.Errorf("transfer %s: %w", t, err)
			}
			if err := json.Unmarshal(out, &res[i]); err != nil {
				return fmt.Errorf("transfer %s: helper output %q: %w", t, out, err)
			}
			l.log.Info("transfer done", "transfer", t.String(), "to", tg.to, "bytes", res[i].Bytes,
				"seconds", fmt.Sprintf("%.2f", res[i].Seconds))
			return nil
		})
	}
	return res, g.Wait()
}

func (l *Lab) nsexecEnv(ctx context.Context, ns string, env []string, argv ...string) ([]byte, error) {
	if len(env) == 0 {
		return l.nsexec(ctx, ns, argv...)
	}
	return l.out(ctx, "env", append(append(env, "ip", "netns", "exec", ns), argv...)...)
}

// HelperMain runs the hidden helper subcommands inside namespaces:
// `serve` (the lab's TCP/UDP/HTTP servers) and `send` (one transfer,
// printing a JSON SendResult). It returns the exit code.
func HelperMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "lab helper: serve or send")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		fs := flag.NewFlagSet("lab serve", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var o ServeOptions
		fs.Func("tcp", "TCP listen address (repeatable)", func(s string) error { o.TCP = append(o.TCP, s); return nil })
		fs.Func("udp", "UDP listen address (repeatable)", func(s string) error { o.UDP = append(o.UDP, s); return nil })
		fs.Func("http", "HTTP listen address (repeatable)", func(s string) error { o.HTTP = append(o.HTTP, s); return nil })
		fs.StringVar(&o.Ready, "ready", "", "file to create once listening")
		fs.Func("vlan", "DEV:VID:CIDR: tag IPv4 from CIDR on DEV with VID, pop received tags (repeatable)", func(s string) error {
			v, err := ParseVLANTag(s)
			o.VLAN = append(o.VLAN, v)
			return err
		})
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if err := Serve(ctx, o, log); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	case "send":
		fs := flag.NewFlagSet("lab send", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var o SendOptions
		var size string
		fs.StringVar(&o.Proto, "proto", "tcp", "tcp, udp, http or icmp")
		fs.StringVar(&o.To, "to", "", "host:port (icmp: host)")
		fs.StringVar(&size, "bytes", "1MiB", "payload bytes, e.g. 4MiB")
		fs.BoolVar(&o.Download, "download", false, "tcp/http: the server sends")
		fs.IntVar(&o.Size, "size", 1000, "udp datagram / icmp payload size")
		fs.DurationVar(&o.Duration, "duration", 0, "spread the payload over this long")
		fs.DurationVar(&o.Timeout, "timeout", 0, "bound on the transfer (default 60s + duration)")
		fs.IntVar(&o.TTL, "ttl", 1, "udp multicast TTL")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		n, err := units.ParseByteSize(size)
		if err != nil {
			fmt.Fprintln(stderr, "lab send: --bytes", err)
			return 2
		}
		o.Bytes = int64(n)
		res, err := Send(ctx, o)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		json.NewEncoder(stdout).Encode(res)
		return 0
	}
	fmt.Fprintf(stderr, "lab helper: unknown subcommand %q (serve or send)\n", args[0])
	return 2
}
