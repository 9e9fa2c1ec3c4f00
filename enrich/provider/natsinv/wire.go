package natsinv

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/gob"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/inventory"
)

// The names on the bus (bucket, object, lease bucket, subjects) are
// transport's (transport/inventory.go), beside the record subjects.
const (
	leaseKey = "leader"
	// Format names the encoding; a reader refuses others.
	Format = "gob+zstd/1"

	hdrFormat  = "Tapflow-Inventory-Format"
	hdrVersion = "Tapflow-Inventory-Version"
	hdrFetched = "Tapflow-Inventory-Fetched"
	hdrDigest  = "Tapflow-Inventory-Digest"
	hdrPorts   = "Tapflow-Inventory-Ports"
)

// maxDecoded bounds what one snapshot may decompress to (a corrupt or
// hostile object must not exhaust the agent's memory): 100k ports are 18 MB.
const maxDecoded = 1 << 30

// Snapshot is a published inventory.
type Snapshot struct {
	Version   uint64
	FetchedAt time.Time
	Digest    string // sha256 of the gob encoding, hex
	Inv       *inventory.Inventory
}

var (
	encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	// decoder decodes into the capacity decompress gives it, no more.
	decoder, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecoded), zstd.WithDecoderConcurrency(1), zstd.WithDecodeAllCapLimit(true))
)

// maxZstdRatio is the most a zstd frame can expand: a 4-byte RLE block
// yields at most 128 KiB.
const maxZstdRatio = 32 << 10

// decompress decodes one zstd frame. The frame declares its decoded size
// and the decoder allocates it before reading a block, so the size is
// checked first: against maxDecoded, and against what the bytes present
// can expand to (187 bytes declaring 879 MiB made a delta allocate them).
// Encode always declares the size; a frame without it is refused.
func decompress(data []byte) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(data); err != nil {
		return nil, fmt.Errorf("zstd frame header: %w", err)
	}
	switch {
	case !h.HasFCS:
		return nil, errors.New("zstd frame does not declare its size (tapflow's encoder always does)")
	case h.FrameContentSize > maxDecoded:
		return nil, fmt.Errorf("zstd frame declares %d bytes, more than the %d a snapshot may have", h.FrameContentSize, maxDecoded)
	case h.FrameContentSize > uint64(len(data))*maxZstdRatio:
		return nil, fmt.Errorf("zstd frame declares %d bytes in %d: more than zstd can expand to", h.FrameContentSize, len(data))
	}
	return decoder.DecodeAll(data, make([]byte, 0, h.FrameContentSize))
}

// Encode returns the compressed encoding of inv and the digest of its
// uncompressed form.
func Encode(inv *inventory.Inventory) (data []byte, digest string, err error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(inv); err != nil {
		return nil, "", fmt.Errorf("encode inventory: %w", err)
	}
	sum := sha256.Sum256(b.Bytes())
	return encoder.EncodeAll(b.Bytes(), make([]byte, 0, b.Len()/8)), hex.EncodeToString(sum[:]), nil
}

// Decode reverses Encode.
func Decode(data []byte) (*inventory.Inventory, error) {
	raw, err := decompress(data)
	if err != nil {
		return nil, fmt.Errorf("decode inventory: zstd: %w", err)
	}
	inv := &inventory.Inventory{}
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(inv); err != nil {
		return nil, fmt.Errorf("decode inventory: gob: %w", err)
	}
	// gob allocates every string: share the repeated ones (as the file
	// provider does), the agent holds this for the snapshot's life
	return inventory.Compact(inv), nil
}

func headers(s *Snapshot) nats.Header {
	h := nats.Header{}
	h.Set(hdrFormat, Format)
	h.Set(hdrVersion, strconv.FormatUint(s.Version, 10))
	h.Set(hdrFetched, s.FetchedAt.UTC().Format(time.RFC3339Nano))
	h.Set(hdrDigest, s.Digest)
	h.Set(hdrPorts, strconv.Itoa(len(s.Inv.Ports)))
	return h
}

// ErrBadMeta marks a snapshot object whose headers this tapflow cannot
// read (another format, a foreign writer).
var ErrBadMeta = errors.New("snapshot headers")

// meta reads what headers wrote (Inv stays nil).
func meta(h nats.Header) (Snapshot, error) {
	// The headers may come from JSON (an object's info, an announcement),
	// where a key can hold an empty list: nats.Header.Get would panic.
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if f := get(hdrFormat); f != Format {
		return Snapshot{}, fmt.Errorf("%w: format %q, this tapflow reads %q (run the same tapflow version for agents and service)", ErrBadMeta, f, Format)
	}
	v, err := strconv.ParseUint(get(hdrVersion), 10, 64)
	if err != nil || v == 0 {
		return Snapshot{}, fmt.Errorf("%w: version %q is not a positive integer", ErrBadMeta, get(hdrVersion))
	}
	at, err := time.Parse(time.RFC3339Nano, get(hdrFetched))
	if err != nil {
		return Snapshot{}, fmt.Errorf("%w: fetch time %q: %v", ErrBadMeta, get(hdrFetched), err)
	}
	return Snapshot{Version: v, FetchedAt: at, Digest: get(hdrDigest)}, nil
}

// The local copy: magic, version, fetch time (Unix ns), digest length and
// digest, then the encoded inventory.
var stateMagic = []byte("TFINV1\n")

// writeState replaces path with s atomically, mode 0600 (the inventory
// names every tenant's ports: not for other users of the host).
func writeState(path string, s *Snapshot, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("inventory state: %w", err)
	}
	var b bytes.Buffer
	b.Write(stateMagic)
	_ = binary.Write(&b, binary.BigEndian, s.Version)
	_ = binary.Write(&b, binary.BigEndian, s.FetchedAt.UnixNano())
	_ = binary.Write(&b, binary.BigEndian, uint16(len(s.Digest)))
	b.WriteString(s.Digest)
	b.Write(data)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".inventory-*")
	if err != nil {
		return fmt.Errorf("inventory state: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: no-op
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("inventory state: %w", err)
	}
	if _, err := tmp.Write(b.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("inventory state %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("inventory state %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("inventory state %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("inventory state: %w", err)
	}
	return nil
}

// errNoState: no local copy yet (first start).
var errNoState = errors.New("no local inventory copy")

func readState(path string) (*Snapshot, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoState
	}
	if err != nil {
		return nil, fmt.Errorf("inventory state: %w", err)
	}
	return parseState(raw, path)
}

// parseState reads the local copy's bytes (path names it in errors).
func parseState(raw []byte, path string) (*Snapshot, error) {
	bad := func(what string) error {
		return fmt.Errorf("inventory state %s: %s; it is rewritten from NATS with the next snapshot (or delete it)", path, what)
	}
	if !bytes.HasPrefix(raw, stateMagic) || len(raw) < len(stateMagic)+18 {
		return nil, bad("not a tapflow inventory copy (bad header)")
	}
	r := raw[len(stateMagic):]
	s := &Snapshot{Version: binary.BigEndian.Uint64(r), FetchedAt: time.Unix(0, int64(binary.BigEndian.Uint64(r[8:])))}
	n := int(binary.BigEndian.Uint16(r[16:]))
	if len(r) < 18+n {
		return nil, bad("truncated")
	}
	if s.Version == 0 {
		return nil, bad("version 0 (versions start at 1)")
	}
	s.Digest = string(r[18 : 18+n])
	var err error
	if s.Inv, err = Decode(r[18+n:]); err != nil {
		return nil, bad(err.Error())
	}
	return s, nil
}
