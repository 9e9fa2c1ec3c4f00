// Package ordered reads a JetStream stream in order through one
// ephemeral AckNone consumer named from its user's slots
// (roles.OrderedNames: <user>-0 … <user>-N-1), the only consumer names an
// ordered subscriber's permissions grant (transport/roles).
//
// nats.go's OrderedConsumer names each consumer it creates
// <prefix>_<serial>, the serial growing at every reset, which no fixed
// permission can grant short of every name. This reader claims a free
// slot instead, recreates its consumer under the same name after a
// sequence gap or the consumer's loss (from the stream sequence after the
// last one delivered, so nothing is skipped that the stream still holds),
// and deletes it at Close. A reader that dies without Close leaves a
// consumer the server deletes after InactiveThreshold, which frees the
// slot.
//
// A claim is exclusive. Its create carries a random max_waiting and a
// description (the claim), and a server that holds the name already
// refuses a create whose configuration differs: nats-server 2.10 and
// later answer "consumer already exists", 2.9 "max waiting can not be
// updated" (2.9 ignores the create-only action and would update other
// fields). Before a reset the reader checks the slot still holds its own
// claim, so it never deletes a consumer another reader took over.
package ordered

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport/roles"
)

// Defaults of Config.
const (
	DefaultInactiveThreshold = 10 * time.Second
	DefaultHeartbeat         = 5 * time.Second
)

// ErrNoSlot: every slot of the user holds a consumer.
var ErrNoSlot = errors.New("every ordered consumer slot is in use")

// ErrStop, returned by a handler, ends Run without an error.
var ErrStop = errors.New("ordered: stop")

// jsConsumerCreate is nats-server's generic consumer-create error code;
// 2.9 answers a create that would change max_waiting with it.
const jsConsumerCreate = 10012

// Config is what to read and under which names.
type Config struct {
	Stream string
	// FilterSubject limits the reader to a subject ("": all).
	FilterSubject string
	// User is the NATS user the slots are named after.
	User string
	// Slots is how many slots the user has (0: roles.DefaultOrderedSlots).
	Slots int
	// DeliverPolicy is where reading starts: DeliverNew (the zero
	// value: messages stored after Open), DeliverAll, DeliverLast,
	// DeliverByStartSequence (OptStartSeq) or DeliverByStartTime
	// (OptStartTime).
	DeliverPolicy jetstream.DeliverPolicy
	OptStartSeq   uint64
	OptStartTime  *time.Time
	// InactiveThreshold is how soon the server deletes the consumer of
	// a reader that stopped pulling (0: DefaultInactiveThreshold).
	InactiveThreshold time.Duration
	// Heartbeat is the server's idle heartbeat on a waiting pull; two
	// missed ones reset the consumer (0: DefaultHeartbeat).
	Heartbeat time.Duration
}

// Reader reads one stream through one slot. Run and Close are not safe
// for concurrent use; Name and Resets are.
type Reader struct {
	js         jetstream.JetStream
	cfg        Config
	log        *slog.Logger
	claim      string
	maxWaiting int

	name        atomic.Pointer[string]
	cons        jetstream.Consumer
	streamSeq   uint64 // of the last message handled (0: none yet)
	consumerSeq uint64
	// reposition: a Run ended with messages pulled but not handled
	// (the pull prefetches); the next recreates after the last handled.
	reposition bool
	resets     atomic.Int64
}

// New validates cfg; it contacts nothing.
func New(js jetstream.JetStream, cfg Config, log *slog.Logger) (*Reader, error) {
	switch {
	case js == nil:
		return nil, errors.New("ordered: no JetStream context")
	case cfg.Stream == "" || strings.ContainsAny(cfg.Stream, ".*> \t"):
		return nil, fmt.Errorf("ordered: stream %q: give a stream name without dots or wildcards", cfg.Stream)
	case cfg.User == "" || strings.ContainsAny(cfg.User, ".*> \t"):
		return nil, fmt.Errorf("ordered: user %q: give the NATS user the slots are named after (letters, digits, - and _)", cfg.User)
	case cfg.Slots < 0 || cfg.Slots > roles.MaxOrderedSlots:
		return nil, fmt.Errorf("ordered: %d slots: use 1..%d (0: %d)", cfg.Slots, roles.MaxOrderedSlots, roles.DefaultOrderedSlots)
	case cfg.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && cfg.OptStartSeq == 0:
		return nil, errors.New("ordered: DeliverByStartSequence without OptStartSeq: set the first stream sequence to read")
	case cfg.DeliverPolicy == jetstream.DeliverByStartTimePolicy && cfg.OptStartTime == nil:
		return nil, errors.New("ordered: DeliverByStartTime without OptStartTime: set the time to read from")
	case cfg.DeliverPolicy == jetstream.DeliverLastPerSubjectPolicy:
		return nil, errors.New("ordered: DeliverLastPerSubject is not supported: use DeliverLast, DeliverAll or a start sequence or time")
	}
	if cfg.InactiveThreshold <= 0 {
		cfg.InactiveThreshold = DefaultInactiveThreshold
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("ordered: claim: %w", err)
	}
	w, err := rand.Int(rand.Reader, big.NewInt(960))
	if err != nil {
		return nil, fmt.Errorf("ordered: claim: %w", err)
	}
	r := &Reader{js: js, cfg: cfg, log: log, claim: "tapflow ordered reader " + hex.EncodeToString(b), maxWaiting: 64 + int(w.Int64())}
	r.name.Store(new(string))
	return r, nil
}

// Name is the slot the reader holds ("" before Open).
func (r *Reader) Name() string { return *r.name.Load() }

// Resets counts the consumer's recreations (gaps, losses).
func (r *Reader) Resets() int64 { return r.resets.Load() }

// Open claims a free slot and creates the consumer there; Run opens
// when it was not. It fails with ErrNoSlot when every slot is in use.
func (r *Reader) Open(ctx context.Context) error {
	if r.cons != nil {
		return nil
	}
	if r.cfg.DeliverPolicy == jetstream.DeliverNewPolicy {
		// From the sequence after the stream's last, so a reset before
		// the first message still starts there.
		st, err := r.js.Stream(ctx, r.cfg.Stream)
		if err != nil {
			return fmt.Errorf("ordered: stream %s: %w", r.cfg.Stream, err)
		}
		r.cfg.DeliverPolicy, r.cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, st.CachedInfo().State.LastSeq+1
	}
	return r.claimSlot(ctx)
}

// errTaken: the slot holds someone else's consumer.
var errTaken = errors.New("slot taken")

func (r *Reader) claimSlot(ctx context.Context) error {
	names := roles.OrderedNames(r.cfg.User, r.cfg.Slots)
	for _, name := range names {
		cons, err := r.create(ctx, name)
		if errors.Is(err, errTaken) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ordered: consumer %s on %s: %w", name, r.cfg.Stream, err)
		}
		r.cons = cons
		r.name.Store(&name)
		return nil
	}
	return fmt.Errorf("ordered: %w: %s on %s (one per running reader; a dead reader's is freed after %s): stop one, wait, or raise the user's ordered_slots (and the reader's slot count)",
		ErrNoSlot, strings.Join(names, ", "), r.cfg.Stream, r.cfg.InactiveThreshold)
}

// create makes the consumer under name unless it exists (errTaken).
func (r *Reader) create(ctx context.Context, name string) (jetstream.Consumer, error) {
	if _, err := r.js.Consumer(ctx, r.cfg.Stream, name); err == nil {
		return nil, errTaken
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	cons, err := r.js.CreateConsumer(ctx, r.cfg.Stream, r.config(name))
	var api *jetstream.APIError
	if errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeConsumerExists ||
		api.ErrorCode == jsConsumerCreate && strings.Contains(api.Description, "can not be updated")) {
		return nil, errTaken // another reader created it since
	}
	if err != nil {
		return nil, err
	}
	if c := cons.CachedInfo().Config; c.Description != r.claim || c.MaxWaiting != r.maxWaiting {
		return nil, errTaken
	}
	return cons, nil
}

// config is the consumer under name, from the sequence after the last
// one delivered once there was one.
func (r *Reader) config(name string) jetstream.ConsumerConfig {
	c := jetstream.ConsumerConfig{
		Name:              name,
		Description:       r.claim,
		AckPolicy:         jetstream.AckNonePolicy,
		MaxWaiting:        r.maxWaiting,
		InactiveThreshold: r.cfg.InactiveThreshold,
		MemoryStorage:     true,
		Replicas:          1,
		FilterSubject:     r.cfg.FilterSubject,
		DeliverPolicy:     r.cfg.DeliverPolicy,
		OptStartSeq:       r.cfg.OptStartSeq,
		OptStartTime:      r.cfg.OptStartTime,
	}
	if r.streamSeq > 0 {
		c.DeliverPolicy, c.OptStartSeq, c.OptStartTime = jetstream.DeliverByStartSequencePolicy, r.streamSeq+1, nil
	}
	return c
}

// handlerError is a handler's own error: Run returns it.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }

// Run hands each message to handle in stream order until ctx ends (nil),
// handle returns ErrStop (nil) or another error (returned), or the
// connection closes. A gap or the consumer's loss recreates it under the
// same name.
func (r *Reader) Run(ctx context.Context, handle func(jetstream.Msg) error) error {
	if err := r.Open(ctx); err != nil {
		return err
	}
	if r.reposition {
		if err := r.recreate(ctx); err != nil {
			return fmt.Errorf("ordered: resuming %s on %s: %w", r.Name(), r.cfg.Stream, err)
		}
		r.reposition = false
	}
	for {
		err := r.read(ctx, handle)
		var h handlerError
		if ctx.Err() != nil || errors.As(err, &h) {
			r.reposition = true
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &h) && errors.Is(h.err, ErrStop):
			return nil
		case errors.As(err, &h):
			return h.err
		case errors.Is(err, jetstream.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionClosed):
			return fmt.Errorf("ordered: reading %s: %w", r.cfg.Stream, err)
		}
		r.log.Warn("ordered consumer lost or out of sequence: recreating it", "consumer", r.Name(), "stream", r.cfg.Stream,
			"from_seq", r.streamSeq+1, "err", err)
		if err := r.reset(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// read pulls until an error: the handler's (handlerError), or one that
// calls for a reset.
func (r *Reader) read(ctx context.Context, handle func(jetstream.Msg) error) error {
	it, err := r.cons.Messages(jetstream.PullHeartbeat(r.cfg.Heartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Consumer != r.consumerSeq+1 {
			return fmt.Errorf("sequence gap: delivery %d after %d", meta.Sequence.Consumer, r.consumerSeq)
		}
		r.consumerSeq, r.streamSeq = meta.Sequence.Consumer, meta.Sequence.Stream
		if err := handle(msg); err != nil {
			return handlerError{err}
		}
	}
}

// reset recreates the consumer, retrying with backoff until ctx ends.
func (r *Reader) reset(ctx context.Context) error {
	r.resets.Add(1)
	wait := 250 * time.Millisecond
	for {
		err := r.recreate(ctx)
		if err == nil || errors.Is(err, ErrNoSlot) {
			return err
		}
		r.log.Warn("recreating the ordered consumer", "consumer", r.Name(), "stream", r.cfg.Stream, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// recreate deletes the slot's consumer when it is still this reader's
// and creates it again after the last message delivered; a slot another
// reader took over in the meantime is left to it, and a free one claimed.
func (r *Reader) recreate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	name := r.Name()
	c, err := r.js.Consumer(ctx, r.cfg.Stream, name)
	switch {
	case err == nil && c.CachedInfo().Config.Description != r.claim:
		r.consumerSeq = 0
		return r.claimSlot(ctx)
	case err == nil:
		if err := r.js.DeleteConsumer(ctx, r.cfg.Stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return err
	}
	r.consumerSeq = 0
	cons, err := r.create(ctx, name)
	if errors.Is(err, errTaken) {
		return r.claimSlot(ctx)
	}
	if err != nil {
		return err
	}
	r.cons = cons
	return nil
}

// Close deletes the reader's consumer (the server would after
// InactiveThreshold), freeing its slot.
func (r *Reader) Close() error {
	name := r.Name()
	if r.cons == nil || name == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.cons = nil
	c, err := r.js.Consumer(ctx, r.cfg.Stream, name)
	if err == nil && c.CachedInfo().Config.Description != r.claim {
		return nil // lost and taken over by another reader: its own now
	}
	if err == nil {
		err = r.js.DeleteConsumer(ctx, r.cfg.Stream, name)
	}
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("ordered: deleting consumer %s on %s (the server drops it after %s): %w", name, r.cfg.Stream, r.cfg.InactiveThreshold, err)
	}
	return nil
}
