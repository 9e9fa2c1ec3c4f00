package natsinv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/enrich/inventory"
)

// StoreConfig sizes the bucket.
type StoreConfig struct {
	Replicas int // JetStream replicas (nats.replicas)
}

// EnsureStore creates the snapshot bucket, or checks it (the service; an
// agent only opens it).
func EnsureStore(ctx context.Context, js jetstream.JetStream, cfg StoreConfig) (jetstream.ObjectStore, error) {
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: Bucket, Description: "tapflow inventory snapshots (tapflow inventory serve); one object, replaced per version",
		Storage: jetstream.FileStorage, Replicas: max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", Bucket, err)
	}
	return obs, nil
}

// Head reads the published snapshot's headers (Inv nil); ok=false when
// none is published yet.
func Head(ctx context.Context, obs jetstream.ObjectStore) (s Snapshot, ok bool, err error) {
	info, err := obs.GetInfo(ctx, Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s/%s: %w", Bucket, Object, err)
	}
	s, err = meta(info.Headers)
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("%s/%s: %w", Bucket, Object, err)
	}
	return s, true, nil
}

// Published is the result of one Publish.
type Published struct {
	Version uint64
	Digest  string
	Bytes   int  // encoded size (what each agent downloads)
	Skipped bool // the store already held this content
	Took    time.Duration
}

// Publish writes inv as the next version unless the store already holds
// the same content (several serve instances, or a restart, publish
// nothing twice). Versions follow the store's head, +1.
func Publish(ctx context.Context, obs jetstream.ObjectStore, inv *inventory.Inventory, fetchedAt time.Time) (Published, error) {
	start := time.Now()
	data, digest, err := Encode(inv)
	if err != nil {
		return Published{}, err
	}
	head, ok, err := Head(ctx, obs)
	if err != nil && !errors.Is(err, ErrBadMeta) {
		return Published{}, err
	}
	if ok && head.Digest == digest {
		return Published{Version: head.Version, Digest: digest, Bytes: len(data), Skipped: true, Took: time.Since(start)}, nil
	}
	s := &Snapshot{Version: head.Version + 1, FetchedAt: fetchedAt, Digest: digest, Inv: inv}
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: Object, Headers: headers(s)}, bytes.NewReader(data)); err != nil {
		return Published{}, fmt.Errorf("publish inventory version %d to %s: %w", s.Version, Bucket, err)
	}
	return Published{Version: s.Version, Digest: digest, Bytes: len(data), Took: time.Since(start)}, nil
}
