package natsinv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// StoreConfig sizes the bucket.
type StoreConfig struct {
	Replicas int // JetStream replicas (nats.replicas)
}

// MaxConsumers bounds the downloads under way at once on the bucket's
// stream: each download is a short-lived ordered consumer, and
// nats-server's default of 1,000 consumers per stream stalled a cold start
// of 1,000 agents (BenchmarkColdStart1000Agents). Agents watch with a
// plain subscription, which is no consumer.
const MaxConsumers = 100_000

// EnsureStore creates the snapshot bucket, or updates it (the service; an
// agent only opens it). The stream is the one nats.go creates for an
// Object Store (OBJ_<bucket>, rollups, direct get), with MaxConsumers set.
func EnsureStore(ctx context.Context, js jetstream.JetStream, cfg StoreConfig) (jetstream.ObjectStore, error) {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: transport.InventoryStream, Description: "tapflow inventory snapshots (tapflow inventory serve); one object, replaced per version",
		Subjects: []string{transport.InventoryChunksSubject(">"), "$O." + transport.InventoryBucket + ".M.>"},
		MaxBytes: -1, Storage: jetstream.FileStorage, Replicas: max(cfg.Replicas, 1),
		Discard: jetstream.DiscardNew, AllowRollup: true, AllowDirect: true, MaxConsumers: MaxConsumers,
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", transport.InventoryBucket, err)
	}
	obs, err := js.ObjectStore(ctx, transport.InventoryBucket)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", transport.InventoryBucket, err)
	}
	return obs, nil
}

// Head reads the published snapshot's headers (Inv nil); ok=false when
// none is published yet.
func Head(ctx context.Context, obs jetstream.ObjectStore) (s Snapshot, ok bool, err error) {
	info, err := obs.GetInfo(ctx, transport.InventoryObject)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s/%s: %w", transport.InventoryBucket, transport.InventoryObject, err)
	}
	s, err = meta(info.Headers)
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("%s/%s: %w", transport.InventoryBucket, transport.InventoryObject, err)
	}
	return s, true, nil
}

// ChunkSize is the Object Store chunk: 4× fewer messages per download
// than the 128 KiB default, and under the nats-server default max_payload
// (1 MiB), so any server carries it.
const ChunkSize = 512 << 10

// Published is the result of one Publish.
type Published struct {
	Version uint64
	Digest  string
	// Inv is the inventory published, normalized (sorted by id): the
	// base of the next delta.
	Inv        *inventory.Inventory
	Bytes      int  // encoded size (what each agent downloads)
	DeltaBytes int  // size of the delta sent before it; 0: none
	Skipped    bool // the store already held this content
	Took       time.Duration
}

// Publish writes inv as the next version unless the store already holds
// the same content (several serve instances, or a restart, publish
// nothing twice). Versions follow the store's head, +1.
func Publish(ctx context.Context, obs jetstream.ObjectStore, inv *inventory.Inventory, fetchedAt time.Time) (Published, error) {
	return PublishFrom(ctx, nil, obs, nil, "", inv, fetchedAt)
}

// PublishFrom is Publish, and when prev (normalized, with digest
// prevDigest) is what the store's head holds, it first sends the delta
// from prev on nc if the delta is much smaller than the snapshot: agents
// holding the head then apply it instead of downloading the snapshot.
func PublishFrom(ctx context.Context, nc *nats.Conn, obs jetstream.ObjectStore, prev *inventory.Inventory, prevDigest string, inv *inventory.Inventory, fetchedAt time.Time) (Published, error) {
	start := time.Now()
	inv = Normalize(inv)
	data, digest, err := Encode(inv)
	if err != nil {
		return Published{}, err
	}
	head, ok, err := Head(ctx, obs)
	if err != nil && !errors.Is(err, ErrBadMeta) {
		return Published{}, err
	}
	if ok && head.Digest == digest {
		return Published{Version: head.Version, Digest: digest, Inv: inv, Bytes: len(data), Skipped: true, Took: time.Since(start)}, nil
	}
	s := &Snapshot{Version: head.Version + 1, FetchedAt: fetchedAt, Digest: digest, Inv: inv}
	res := Published{Version: s.Version, Digest: digest, Inv: inv, Bytes: len(data)}
	if nc != nil && prev != nil && ok && head.Digest == prevDigest {
		m, err := encodeDelta(head.Version, s, Diff(prev, inv))
		if err == nil && deltaPays(len(m.Data), len(data)) {
			// Best effort: an agent that misses it downloads the snapshot.
			if err := nc.PublishMsg(m); err == nil {
				res.DeltaBytes = len(m.Data)
			}
		}
	}
	meta := jetstream.ObjectMeta{Name: transport.InventoryObject, Headers: headers(s), Opts: &jetstream.ObjectMetaOptions{ChunkSize: ChunkSize}}
	if _, err := obs.Put(ctx, meta, bytes.NewReader(data)); err != nil {
		return Published{}, fmt.Errorf("publish inventory version %d to %s: %w", s.Version, transport.InventoryBucket, err)
	}
	res.Took = time.Since(start)
	return res, nil
}
