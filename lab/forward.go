package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// loopbackForwarder makes API servers that listen on the host's 127.0.0.1
// (the OpenStack testbed) reachable on the same address inside a lab
// namespace: tapflow runs in the hypervisor namespace, whose loopback is
// its own. Each listener is opened inside the namespace (a socket stays in
// the namespace it was created in); the connections it accepts are dialled
// on from the host namespace and copied both ways.
type loopbackForwarder struct {
	lns  []net.Listener
	wg   sync.WaitGroup
	log  *slog.Logger
	stop chan struct{}
}

// listenIn opens a TCP listener on addr inside the named namespace. The
// OS thread that switched namespaces is locked and, if switching back
// fails, discarded with its goroutine.
func listenIn(nsName, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(nsName)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("namespace %s: %w", nsName, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter namespace %s: %w", nsName, err)}
			return
		}
		ln, lerr := net.Listen("tcp", addr)
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			if ln != nil {
				ln.Close()
			}
			ch <- result{err: fmt.Errorf("return from namespace %s: %w", nsName, err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ln: ln, err: lerr}
	}()
	r := <-ch
	return r.ln, r.err
}

// forwardLoopback starts one forwarder per host:port (loopback addresses
// only; others are skipped) into namespace ns.
func forwardLoopback(ns string, addrs []string, log *slog.Logger) (*loopbackForwarder, error) {
	f := &loopbackForwarder{log: log, stop: make(chan struct{})}
	seen := map[string]bool{}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil || seen[a] {
			continue
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			continue
		}
		seen[a] = true
		ln, err := listenIn(ns, a)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lab: forward %s into %s: %w", a, ns, err)
		}
		f.lns = append(f.lns, ln)
		f.wg.Add(1)
		go f.serve(ln, a)
	}
	return f, nil
}

func (f *loopbackForwarder) serve(ln net.Listener, target string) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				f.log.Warn("lab: forwarder accept", "addr", target, "err", err)
			}
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			u, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
			cancel()
			if err != nil {
				f.log.Warn("lab: forwarder dial", "addr", target, "err", err)
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			cp := func(dst, src net.Conn) {
				io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go cp(u, c)
			go cp(c, u)
			select {
			case <-done:
				<-done
			case <-f.stop:
			}
		}()
	}
}

// Close stops listening, ends the open connections and waits.
func (f *loopbackForwarder) Close() error {
	if f == nil {
		return nil
	}
	close(f.stop)
	for _, ln := range f.lns {
		ln.Close()
	}
	f.wg.Wait()
	return nil
}
