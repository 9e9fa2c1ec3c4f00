package consume

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ackHandle acks one held message through its reply subject alone.
//
// Why not keep the jetstream.Msg: a message is held until the file its
// records went to commits (up to roll_age, thousands of messages per
// file), and the jetstream.Msg keeps its payload (the whole compressed
// agent batch, ~1 MiB) alive until then, although the records were
// decoded and written long before. The bodies are JetStream's ack
// protocol, byte for byte what nats.go's jetstream.Msg sends (+ACK,
// +WPI, -NAK {"delay": ns}), published on the same connection.
type ackHandle struct {
	nc    *nats.Conn
	reply string
	done  atomic.Bool // acked or nacked: no more in-progress acks
	size  int64       // stream bytes of the message (early commits)
}

var errNoReply = errors.New("message has no reply subject (not from a JetStream consumer)")

func newAckHandle(nc *nats.Conn, reply string) *ackHandle {
	return &ackHandle{nc: nc, reply: reply}
}

func (h *ackHandle) send(body []byte) error {
	if h.reply == "" {
		return errNoReply
	}
	return h.nc.Publish(h.reply, body)
}

// ack acknowledges the message (its records are committed).
func (h *ackHandle) ack() error {
	h.done.Store(true)
	return h.send([]byte("+ACK"))
}

// nakWithDelay asks for redelivery after d.
func (h *ackHandle) nakWithDelay(d time.Duration) error {
	h.done.Store(true)
	if d <= 0 {
		return h.send([]byte("-NAK"))
	}
	return h.send([]byte(`-NAK {"delay": ` + strconv.FormatInt(d.Nanoseconds(), 10) + `}`))
}

// inProgress resets the server's ack timer while the message is held.
func (h *ackHandle) inProgress() error {
	if h.done.Load() {
		return nil
	}
	return h.send([]byte("+WPI"))
}
