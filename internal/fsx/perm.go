package fsx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// Modes of what tapflow writes (docs/security.md): shared data (Parquet,
// JSONL) is group-readable so a reader group can be let in; private state
// (spool, batch sequences) is owner-only. Never world-readable.
const (
	DataFile    os.FileMode = 0o640
	DataDir     os.FileMode = 0o750
	PrivateFile os.FileMode = 0o600
	PrivateDir  os.FileMode = 0o700
)

// NoGroup keeps the process's group.
const NoGroup = -1

// LookupGroup resolves a group name or number ("" = NoGroup).
func LookupGroup(name string) (int, error) {
	if name == "" {
		return NoGroup, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr == nil {
			g, err = user.LookupGroupId(name)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("group %q does not exist on this host (%v)", name, err)
	}
	return strconv.Atoi(g.Gid)
}

// OpenFile opens path like os.OpenFile and, when it creates the file,
// sets exactly mode (whatever the umask) and group gid (NoGroup: keep).
func OpenFile(path string, flag int, mode os.FileMode, gid int) (*os.File, error) {
	f, err := os.OpenFile(path, flag, mode)
	if err != nil {
		return nil, err
	}
	if flag&os.O_CREATE != 0 {
		if err := setPerm(f, mode, gid); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return f, nil
}

// WriteFile writes data to path with exactly mode and group gid.
func WriteFile(path string, data []byte, mode os.FileMode, gid int) error {
	f, err := OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode, gid)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func setPerm(f *os.File, mode os.FileMode, gid int) error {
	if gid != NoGroup {
		if err := f.Chown(-1, gid); err != nil {
			return fmt.Errorf("chgrp %d: %w", gid, err)
		}
	}
	return f.Chmod(mode) // after chown: chown may clear setgid bits, never ours
}

// Mkdir creates dir (not its parents) with exactly mode and group gid;
// an existing directory is left as it is.
func Mkdir(dir string, mode os.FileMode, gid int) error {
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	if gid != NoGroup {
		if err := os.Lchown(dir, -1, gid); err != nil {
			return fmt.Errorf("chgrp %s: %w", dir, err)
		}
	}
	return os.Chmod(dir, mode)
}

// MkdirAll is os.MkdirAll setting exactly mode and group gid on dir when
// it creates it; missing parents get DataDir (0750) and gid, so a private
// directory inside a shared one (the NATS store in data_dir, next to the
// Parquet output) does not lock readers out of its siblings.
func MkdirAll(dir string, mode os.FileMode, gid int) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := MkdirAll(parent, DataDir, gid); err != nil {
			return err
		}
	}
	return Mkdir(dir, mode, gid)
}
