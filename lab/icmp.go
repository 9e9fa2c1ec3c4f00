package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

func setMulticastTTL(c *net.UDPConn, v4 bool, ttl int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v4 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, ttl)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, ttl)
		}
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set multicast ttl: %w", serr)
	}
	return nil
}

// sendICMP sends echo requests whose payloads add up to o.Bytes (each
// o.Size bytes, the last one the rest), at most 32 unanswered at a time,
// and counts the payload of the answered ones.
func sendICMP(ctx context.Context, o SendOptions) (int64, int, error) {
	dst, err := net.ResolveIPAddr("ip", o.To)
	if err != nil {
		return 0, 0, err
	}
	v4 := dst.IP.To4() != nil
	network, reqType, repType := "ip4:icmp", byte(8), byte(0)
	if !v4 {
		network, reqType, repType = "ip6:ipv6-icmp", 128, 129
	}
	c, err := net.ListenPacket(network, "")
	if err != nil {
		return 0, 0, fmt.Errorf("open a raw ICMP socket (needs root): %w", err)
	}
	defer c.Close()
	id := uint16(rand.IntN(1 << 16))
	total := int((o.Bytes + int64(o.Size) - 1) / int64(o.Size))
	sizeOf := func(seq int) int {
		if seq == total-1 && o.Bytes%int64(o.Size) != 0 {
			return int(o.Bytes % int64(o.Size))
		}
		return o.Size
	}
	var (
		mu       sync.Mutex
		answered = map[uint16]bool{}
		got      int64
		cond     = make(chan struct{}, 1)
	)
	done := make(chan struct{})
	defer close(done)
	go func() {
		buf := make([]byte, 65536)
		for {
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := c.ReadFrom(buf)
			select {
			case <-done:
				return
			default:
			}
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return
			}
			if n < 8 || buf[0] != repType || binary.BigEndian.Uint16(buf[4:]) != id {
				continue
			}
			seq := binary.BigEndian.Uint16(buf[6:])
			mu.Lock()
			if !answered[seq] && int(seq) < total {
				answered[seq] = true
				got += int64(n - 8)
			}
			mu.Unlock()
			select {
			case cond <- struct{}{}:
			default:
			}
		}
	}()
	dur := o.Duration
	p := pacer{start: time.Now(), total: o.Bytes, d: dur}
	pkt := make([]byte, 8+o.Size)
	var sent int64
	for seq := 0; seq < total; seq++ {
		for {
			mu.Lock()
			outstanding := seq - len(answered)
			mu.Unlock()
			if outstanding < 32 {
				break
			}
			select {
			case <-cond:
			case <-time.After(time.Second):
				return got, seq, fmt.Errorf("32 echo requests unanswered for 1s (is %s reachable?)", o.To)
			case <-ctx.Done():
				return got, seq, ctx.Err()
			}
		}
		if err := p.wait(ctx, sent); err != nil {
			return got, seq, err
		}
		n := sizeOf(seq)
		b := pkt[:8+n]
		clear(b)
		b[0] = reqType
		binary.BigEndian.PutUint16(b[4:], id)
		binary.BigEndian.PutUint16(b[6:], uint16(seq))
		if v4 {
			binary.BigEndian.PutUint16(b[2:], checksum(b))
		}
		if _, err := c.WriteTo(b, dst); err != nil {
			return got, seq, err
		}
		sent += int64(n)
	}
	deadline := time.After(3 * time.Second)
	for {
		mu.Lock()
		all := len(answered) == total
		g := got
		mu.Unlock()
		if all {
			return g, total, nil
		}
		select {
		case <-cond:
		case <-deadline:
			mu.Lock()
			defer mu.Unlock()
			return got, total, fmt.Errorf("%d of %d echo requests unanswered", total-len(answered), total)
		case <-ctx.Done():
			return g, total, ctx.Err()
		}
	}
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
