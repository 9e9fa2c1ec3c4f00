package natsinv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

// Lease elects one publisher among the serve instances: the holder of the
// key "leader" in KV bucket TAPFLOW_INVENTORY_LEASE, whose entries expire
// after the lease TTL. The holder renews every TTL/3 by compare-and-set on
// its revision; the others try to create the key every TTL/3, which only
// succeeds once it expired. A holder that cannot renew for a whole TTL
// (NATS down, or another instance won the key) stops publishing.
type Lease struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	rev uint64
	at  time.Time // last successful create or renew
}

// NewLease creates (or opens) the lease bucket for instance id.
func NewLease(ctx context.Context, js jetstream.JetStream, id string, ttl time.Duration, replicas int) (*Lease, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("lease ttl %s: use at least 1s", ttl)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: transport.InventoryLeaseBucket, Description: "tapflow inventory serve: which instance publishes", History: 1, TTL: ttl,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("kv %s: %w", transport.InventoryLeaseBucket, err)
	}
	return &Lease{kv: kv, id: id, ttl: ttl}, nil
}

// TTL is the lease duration.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Try acquires or renews the lease and reports whether this instance
// holds it now.
func (l *Lease) Try(ctx context.Context) (bool, error) {
	now := time.Now()
	if l.rev != 0 {
		rev, err := l.kv.Update(ctx, leaseKey, []byte(l.id), l.rev)
		if err == nil {
			l.rev, l.at = rev, now
			return true, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) || now.Sub(l.at) >= l.ttl {
			l.rev = 0 // someone else holds it, or it expired under us
			return false, fmt.Errorf("lease lost: %w", err)
		}
		return true, fmt.Errorf("lease renew (held until %s): %w", l.at.Add(l.ttl).Format(time.RFC3339), err)
	}
	rev, err := l.kv.Create(ctx, leaseKey, []byte(l.id))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("lease: %w", err)
	}
	l.rev, l.at = rev, now
	return true, nil
}

// Holder names the instance holding the lease ("" when none).
func (l *Lease) Holder(ctx context.Context) string {
	e, err := l.kv.Get(ctx, leaseKey)
	if err != nil {
		return ""
	}
	return string(e.Value())
}

// Release gives the lease up (a clean stop), so another instance takes
// over at once instead of after the TTL.
func (l *Lease) Release(ctx context.Context) error {
	if l.rev == 0 {
		return nil
	}
	err := l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(l.rev))
	l.rev = 0
	return err
}
