package lab

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

// The lab's traffic protocol. TCP: the client sends an 8-byte big-endian
// download size D. D = 0 is an upload: the client streams its payload and
// half-closes; the server answers with the 8-byte count it read. D > 0: the
// server sends D bytes and closes. HTTP: POST discards the body and answers
// {"received":N}; GET /bytes/N answers N bytes; any other GET answers a
// small metadata document. UDP: datagrams are read and discarded.

// ServeOptions are the listeners of `tapflow lab serve`.
type ServeOptions struct {
	TCP, UDP, HTTP []string // listen addresses, e.g. "[::]:5001"
	Ready          string   // file created once every listener is open
	// VLAN tags the guest's subport traffic (vlan.go), held until exit.
	VLAN []VLANTag
}

// Serve runs the lab servers until ctx is done.
func Serve(ctx context.Context, o ServeOptions, log *slog.Logger) error {
	if len(o.TCP)+len(o.UDP)+len(o.HTTP) == 0 {
		return errors.New("lab serve: no listener; give --tcp, --udp or --http")
	}
	var lc net.ListenConfig
	g, ctx := errgroup.WithContext(ctx)
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	if len(o.VLAN) > 0 {
		detach, err := AttachVLANTags(o.VLAN)
		if err != nil {
			return err
		}
		defer detach()
	}
	for _, a := range o.TCP {
		ln, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			return fmt.Errorf("lab serve: tcp %s: %w", a, err)
		}
		closers = append(closers, ln)
		g.Go(func() error { return serveTCP(ln, log) })
	}
	for _, a := range o.UDP {
		pc, err := lc.ListenPacket(ctx, "udp", a)
		if err != nil {
			return fmt.Errorf("lab serve: udp %s: %w", a, err)
		}
		closers = append(closers, pc)
		g.Go(func() error { return serveUDP(pc) })
	}
	for _, a := range o.HTTP {
		ln, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			return fmt.Errorf("lab serve: http %s: %w", a, err)
		}
		srv := &http.Server{Handler: httpHandler(log), ReadHeaderTimeout: 10 * time.Second}
		closers = append(closers, srv)
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if o.Ready != "" {
		if err := os.WriteFile(o.Ready, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fmt.Errorf("lab serve: ready file: %w", err)
		}
	}
	log.Info("lab serve ready", "tcp", o.TCP, "udp", o.UDP, "http", o.HTTP)
	g.Go(func() error {
		<-ctx.Done()
		for _, c := range closers {
			c.Close()
		}
		return nil
	})
	err := g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func serveTCP(ln net.Listener, log *slog.Logger) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			if err := handleTCP(c); err != nil {
				log.Warn("tcp transfer", "peer", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

func handleTCP(c net.Conn) error {
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	if d := binary.BigEndian.Uint64(hdr[:]); d > 0 {
		_, err := io.CopyN(c, zeros{}, int64(d))
		return err
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint64(hdr[:], uint64(n))
	_, err = c.Write(hdr[:])
	return err
}

func serveUDP(pc net.PacketConn) error {
	buf := make([]byte, 65536)
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
}

func httpHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost || r.Method == http.MethodPut:
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				log.Warn("http upload", "peer", r.RemoteAddr, "err", err)
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, "{\"received\":%d}\n", n)
		case strings.HasPrefix(r.URL.Path, "/bytes/"):
			n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64)
			if err != nil || n < 0 {
				http.Error(w, "use /bytes/N", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			w.Header().Set("Content-Type", "application/octet-stream")
			io.CopyN(w, zeros{}, n)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, "{\"uuid\":\"lab\",\"hostname\":%q,\"availability_zone\":\"nova\"}\n", hostname())
		}
	})
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// SendOptions is one transfer of `tapflow lab send`.
type SendOptions struct {
	Proto    string        // tcp, udp, http or icmp
	To       string        // host:port (icmp: host)
	Bytes    int64         // payload bytes (upload, or download with Download)
	Download bool          // tcp/http: the server sends
	Size     int           // udp datagram / icmp echo payload size (default 1000)
	Duration time.Duration // spread the payload over this long (0: as fast as possible)
	Timeout  time.Duration // whole transfer (default 60s + Duration)
	TTL      int           // udp multicast TTL (default 1)
}

// SendResult is what a transfer confirmed.
type SendResult struct {
	Proto    string  `json:"proto"`
	To       string  `json:"to"`
	Bytes    int64   `json:"bytes"`    // payload bytes confirmed (udp: sent)
	Packets  int     `json:"packets"`  // udp datagrams / icmp echoes
	Seconds  float64 `json:"seconds"`  // wall time
	Download bool    `json:"download"` // direction
}

// Send runs one transfer and checks the server confirmed every payload byte
// (tcp, http: the count the server read or sent; icmp: every echo
// answered).
func Send(ctx context.Context, o SendOptions) (SendResult, error) {
	if o.Size <= 0 {
		o.Size = 1000
	}
	if o.Timeout <= 0 {
		o.Timeout = 60*time.Second + o.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	start := time.Now()
	res := SendResult{Proto: o.Proto, To: o.To, Download: o.Download}
	var err error
	switch o.Proto {
	case "tcp":
		res.Bytes, err = sendTCP(ctx, o)
	case "http":
		res.Bytes, err = sendHTTP(ctx, o)
	case "udp":
		res.Bytes, res.Packets, err = sendUDP(ctx, o)
	case "icmp":
		res.Bytes, res.Packets, err = sendICMP(ctx, o)
	default:
		err = fmt.Errorf("protocol %q: use tcp, udp, http or icmp", o.Proto)
	}
	res.Seconds = time.Since(start).Seconds()
	if err != nil {
		return res, fmt.Errorf("lab send %s to %s: %w", o.Proto, o.To, err)
	}
	if res.Bytes != o.Bytes {
		return res, fmt.Errorf("lab send %s to %s: %d payload bytes confirmed, want %d", o.Proto, o.To, res.Bytes, o.Bytes)
	}
	return res, nil
}

// pacer spreads n bytes over d: wait(k) sleeps until k bytes are due.
type pacer struct {
	start time.Time
	total int64
	d     time.Duration
}

func (p pacer) wait(ctx context.Context, sent int64) error {
	if p.d <= 0 || p.total <= 0 {
		return ctx.Err()
	}
	due := p.start.Add(time.Duration(float64(p.d) * float64(sent) / float64(p.total)))
	if w := time.Until(due); w > 0 {
		t := time.NewTimer(w)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return ctx.Err()
}

func sendTCP(ctx context.Context, o SendOptions) (int64, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", o.To)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var hdr [8]byte
	if o.Download {
		binary.BigEndian.PutUint64(hdr[:], uint64(o.Bytes))
		if _, err := c.Write(hdr[:]); err != nil {
			return 0, err
		}
		return io.Copy(io.Discard, c)
	}
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	if err := writePaced(ctx, c, o.Bytes, o.Duration); err != nil {
		return 0, err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, fmt.Errorf("read the server's count: %w", err)
	}
	return int64(binary.BigEndian.Uint64(hdr[:])), nil
}

func writePaced(ctx context.Context, w io.Writer, n int64, d time.Duration) error {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	p := pacer{start: time.Now(), total: n, d: d}
	for sent := int64(0); sent < n; {
		k := min(int64(chunk), n-sent)
		if d > 0 {
			k = min(k, max(n/200, 1024))
		}
		if err := p.wait(ctx, sent); err != nil {
			return err
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		sent += k
	}
	return nil
}

// pacedReader is an HTTP request body of n zero bytes spread over d.
type pacedReader struct {
	ctx  context.Context
	left int64
	sent int64
	p    pacer
}

func (r *pacedReader) Read(b []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if err := r.p.wait(r.ctx, r.sent); err != nil {
		return 0, err
	}
	k := min(int64(len(b)), r.left)
	if r.p.d > 0 {
		k = min(k, max(r.p.total/200, 1024))
	}
	clear(b[:k])
	r.left -= k
	r.sent += k
	return int(k), nil
}

func sendHTTP(ctx context.Context, o SendOptions) (int64, error) {
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	host := o.To
	if o.Download {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/bytes/"+strconv.FormatInt(o.Bytes, 10), nil)
		if err != nil {
			return 0, err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET: %s", resp.Status)
		}
		return io.Copy(io.Discard, resp.Body)
	}
	body := &pacedReader{ctx: ctx, left: o.Bytes, p: pacer{start: time.Now(), total: o.Bytes, d: o.Duration}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+"/upload", body)
	if err != nil {
		return 0, err
	}
	req.ContentLength = o.Bytes
	if o.Bytes == 0 {
		req.Body = http.NoBody
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("POST: %s", resp.Status)
	}
	var got struct {
		Received int64 `json:"received"`
	}
	if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&got); err != nil {
		return 0, fmt.Errorf("decode the server's answer: %w", err)
	}
	return got.Received, nil
}

func sendUDP(ctx context.Context, o SendOptions) (int64, int, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", o.To)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok && ua.IP.IsMulticast() {
		if err := setMulticastTTL(c.(*net.UDPConn), ua.IP.To4() != nil, max(o.TTL, 1)); err != nil {
			return 0, 0, err
		}
	}
	buf := make([]byte, o.Size)
	// Without pacing, keep under ~200 MB/s so a slow receiver does not
	// turn the transfer into ENOBUFS loops.
	dur := o.Duration
	if dur == 0 {
		dur = time.Duration(o.Bytes/200) * time.Microsecond
	}
	p := pacer{start: time.Now(), total: o.Bytes, d: dur}
	var sent int64
	n := 0
	for sent < o.Bytes {
		k := min(int64(o.Size), o.Bytes-sent)
		if err := p.wait(ctx, sent); err != nil {
			return sent, n, err
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return sent, n, err
		}
		sent += k
		n++
	}
	return sent, n, nil
}
