package schemas

import (
	"errors"
	"fmt"
	"testing"
)

func TestBodyCodec(t *testing.T) {
	for _, codec := range Codecs {
		for _, n := range []int{0, 1, 1000} {
			t.Run(fmt.Sprintf("%s/%d", codec, n), func(t *testing.T) {
				enc, err := NewEncoder(codec)
				if err != nil {
					t.Fatal(err)
				}
				body, err := enc.Encode(nil, sample(n))
				if err != nil {
					t.Fatal(err)
				}
				want := codec
				if n == 0 && codec != CodecZstd {
					// arrow-go writes an empty batch without a compression
					// field; its buffers are empty either way.
					want = ""
				}
				got, err := BodyCodec(body)
				if err != nil {
					t.Fatal(err)
				}
				if want != "" && got != want {
					t.Fatalf("BodyCodec = %q, want %q", got, want)
				}
				if enc.Codec() != codec || enc.Schema() != SchemaName {
					t.Fatalf("encoder names %q/%q, want %q/%q", enc.Codec(), enc.Schema(), codec, SchemaName)
				}
			})
		}
	}
}

func TestBodyCodecCorrupt(t *testing.T) {
	enc, _ := NewEncoder(CodecLZ4)
	body, _ := enc.Encode(nil, sample(100))
	for name, b := range map[string][]byte{
		"empty":     {},
		"garbage":   []byte("hello, this is not arrow"),
		"truncated": body[:40],
		"huge len":  {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := BodyCodec(b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("BodyCodec = %q, %v; want ErrCorrupt", got, err)
			}
		})
	}
}

func FuzzBodyCodec(f *testing.F) {
	for _, c := range Codecs {
		enc, _ := NewEncoder(c)
		body, _ := enc.Encode(nil, sample(3))
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = BodyCodec(b) }) // must not panic
}
