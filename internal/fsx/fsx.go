// Package fsx holds the small file-system durability helpers shared by the
// writers that promise "committed means on disk" (Parquet sink, spool).
package fsx

import "os"

// SyncDir fsyncs a directory, making renames and creations inside it
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
