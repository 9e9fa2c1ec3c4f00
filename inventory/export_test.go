package inventory

import "bytes"

// Streamed reads data only in pieces (no fallback).
func Streamed(data []byte) (*Inventory, error) { return readStream(bytes.NewReader(data)) }

// ParseWhole is the whole-document reader.
func ParseWhole(data []byte, name string) (*Inventory, error) { return parseWhole(data, name) }
