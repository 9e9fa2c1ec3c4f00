package nodeview

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/gob"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

// Names on the bus are transport's (transport/inventory.go). Each node's
// overlay is the last message on its own subject
// (transport.InventoryNodeSubject) of transport.InventoryNodesStream; an
// agent reads it with the last-by-subject direct get, whose request
// subject names the node, so its permission can be pinned to its node
// (an Object Store object cannot: its chunks' subjects are random).
// HeldSums reads with the consumer transport.InventorySumsConsumer.
const (
	// Format names the encoding; a reader refuses others.
	Format    = "gob+zstd/1"
	hdrFormat = "Tapflow-Overlay-Format"
	// hdrSum carries Sum of the overlay: a new leader compares it with
	// its own overlays and republishes only those that differ.
	hdrSum = "Tapflow-Overlay-Sum"
	// maxDecoded bounds what one overlay may decompress to.
	maxDecoded = 64 << 20
)

// DirectGetSubject is the request that returns node's overlay: the
// last-by-subject direct get on transport.InventoryNodesStream.
func DirectGetSubject(node string) string {
	return "$JS.API.DIRECT.GET." + transport.InventoryNodesStream + "." + transport.InventoryNodeSubject(node)
}

// ValidNode reports whether node can be a subject token.
func ValidNode(node string) error {
	if node == "" || strings.ContainsAny(node, ".*> \t\r\n") {
		return fmt.Errorf("node %q cannot name an overlay subject: use a name without dots, spaces, '*' or '>'", node)
	}
	return nil
}

// EnsureStream creates or updates transport.InventoryNodesStream (the
// service's job): one message kept per node, read by direct get.
func EnsureStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: transport.InventoryNodesStream, Description: "tapflow inventory: each node's overlay on the shared view (node-scoped views)",
		Subjects: []string{transport.InventoryNodeRoot + ".*"}, MaxMsgsPerSubject: 1, Storage: jetstream.FileStorage,
		Replicas: max(replicas, 1), AllowDirect: true, Discard: jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", transport.InventoryNodesStream, err)
	}
	return nil
}

var (
	encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	decoder, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecoded), zstd.WithDecoderConcurrency(1), zstd.WithDecodeAllCapLimit(true))
)

// Encode is o on the wire: gob, then zstd.
func Encode(o *Overlay) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(o); err != nil {
		return nil, fmt.Errorf("encode overlay of %s: %w", o.Node, err)
	}
	return encoder.EncodeAll(b.Bytes(), nil), nil
}

// Decode reverses Encode.
func Decode(data []byte) (*Overlay, error) {
	// The frame declares its size and the decoder allocates it first:
	// check it against the bound and what the bytes present can expand
	// to (zstd: at most 128 KiB per 4-byte block), as natsinv does.
	var h zstd.Header
	if err := h.Decode(data); err != nil {
		return nil, fmt.Errorf("decode overlay: zstd frame header: %w", err)
	}
	if !h.HasFCS || h.FrameContentSize > maxDecoded || h.FrameContentSize > uint64(len(data))<<15 {
		return nil, fmt.Errorf("decode overlay: zstd frame declares %d bytes in %d (size declared: %v): not an overlay", h.FrameContentSize, len(data), h.HasFCS)
	}
	raw, err := decoder.DecodeAll(data, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return nil, fmt.Errorf("decode overlay: zstd: %w", err)
	}
	o := &Overlay{}
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(o); err != nil {
		return nil, fmt.Errorf("decode overlay: gob: %w", err)
	}
	return o, nil
}

// Publish stores o as its node's overlay. An overlay larger than the
// server's max_payload is refused by the server: the error says so.
func Publish(ctx context.Context, js jetstream.JetStream, o *Overlay) error {
	if err := ValidNode(o.Node); err != nil {
		return err
	}
	data, err := Encode(o)
	if err != nil {
		return err
	}
	return PublishEncoded(ctx, js, o.Node, data)
}

// PublishEncoded stores data (Encode of node's overlay).
func PublishEncoded(ctx context.Context, js jetstream.JetStream, node string, data []byte) error {
	if err := ValidNode(node); err != nil {
		return err
	}
	m := nats.NewMsg(transport.InventoryNodeSubject(node))
	m.Header.Set(hdrFormat, Format)
	m.Header.Set(hdrSum, Sum(data))
	m.Data = data
	if _, err := js.PublishMsg(ctx, m); err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			return fmt.Errorf("overlay of %s: %d bytes exceed the server's max_payload: raise it in the nats-server configuration: %w", node, len(data), err)
		}
		return fmt.Errorf("publish overlay of %s: %w", node, err)
	}
	return nil
}

// Sum is the digest of an encoded overlay PublishEncoded sends in its
// header: hex SHA-256.
func Sum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// HeldSums reads the Sum of every overlay transport.InventoryNodesStream
// holds, by node, from the headers of the last message on each node's
// subject (consumer transport.InventorySumsConsumer, which delivers
// headers only: about 200 bytes a node, no overlay crosses the bus). An
// overlay published without one is left out.
func HeldSums(ctx context.Context, js jetstream.JetStream) (map[string]string, error) {
	st, err := js.Stream(ctx, transport.InventoryNodesStream)
	if err != nil {
		return nil, fmt.Errorf("overlay sums: stream %s: %w", transport.InventoryNodesStream, err)
	}
	out := map[string]string{}
	if st.CachedInfo().State.Msgs == 0 {
		return out, nil
	}
	// One consumer by name (the service's right names it), deleted after.
	c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Name: transport.InventorySumsConsumer, FilterSubject: transport.InventoryNodeRoot + ".*",
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute})
	if err != nil {
		return nil, fmt.Errorf("overlay sums: consumer %s on %s: %w", transport.InventorySumsConsumer, transport.InventoryNodesStream, err)
	}
	defer func() { _ = st.DeleteConsumer(context.WithoutCancel(ctx), transport.InventorySumsConsumer) }()
	for {
		done, got, err := fetchSums(ctx, c, out)
		if done {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("overlay sums: fetch from %s: %w", transport.InventoryNodesStream, err)
		}
		if got == 0 {
			return nil, fmt.Errorf("overlay sums: %s delivered nothing", transport.InventoryNodesStream)
		}
	}
}

// fetchSums adds one batch of HeldSums; done when the last was read.
func fetchSums(ctx context.Context, c jetstream.Consumer, out map[string]string) (done bool, got int, err error) {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	batch, err := c.Fetch(1000, jetstream.FetchContext(fctx))
	if err != nil {
		return false, 0, err
	}
	for m := range batch.Messages() {
		got++
		if sum := m.Headers().Get(hdrSum); sum != "" {
			out[strings.TrimPrefix(m.Subject(), transport.InventoryNodeRoot+".")] = sum
		}
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			return true, got, nil
		}
	}
	return false, got, batch.Error()
}

// ErrNoOverlay means the service has published no overlay for the node.
var ErrNoOverlay = errors.New("no overlay for this node yet")

// Fetch reads node's overlay with the last-by-subject direct get (the
// only read an agent's permissions allow it).
func Fetch(ctx context.Context, nc *nats.Conn, node string) (*Overlay, error) {
	o, _, err := fetchRaw(ctx, nc, node)
	return o, err
}

// fetchRaw is Fetch, with the overlay's encoding.
func fetchRaw(ctx context.Context, nc *nats.Conn, node string) (*Overlay, []byte, error) {
	if err := ValidNode(node); err != nil {
		return nil, nil, err
	}
	m, err := nc.RequestWithContext(ctx, DirectGetSubject(node), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("overlay of %s: direct get on %s: %w", node, transport.InventoryNodesStream, err)
	}
	if st := m.Header.Get("Status"); st != "" {
		if st == "404" {
			return nil, nil, fmt.Errorf("overlay of %s: %w", node, ErrNoOverlay)
		}
		return nil, nil, fmt.Errorf("overlay of %s: direct get on %s: status %s %s", node, transport.InventoryNodesStream, st, m.Header.Get("Description"))
	}
	if f := m.Header.Get(hdrFormat); f != Format {
		return nil, nil, fmt.Errorf("overlay of %s: format %q, want %q (an older or newer tapflow inventory serve)", node, f, Format)
	}
	o, err := Decode(m.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("overlay of %s: %w", node, err)
	}
	if o.Node != node {
		return nil, nil, fmt.Errorf("overlay of %s names node %q", node, o.Node)
	}
	return o, m.Data, nil
}
