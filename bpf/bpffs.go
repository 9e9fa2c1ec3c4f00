//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// BPFFSRoot is where systemd mounts the bpf filesystem at boot, and where
// capture.pin_dir lives by default.
const BPFFSRoot = "/sys/fs/bpf"

// MountBPFFS mounts a bpf filesystem at /sys/fs/bpf (mode 0700) when
// pinDir lies below it and nothing is mounted there yet: a host or
// container without systemd, which mounts it at boot, as the agent's
// unit does in ExecStartPre. It reports whether it mounted. It changes
// nothing when pinDir is already on bpffs or lies elsewhere, when
// /sys/fs/bpf holds another mount (a sandbox's tmpfs), or when the process
// may not mount (no CAP_SYS_ADMIN): preparePinDir then names the fix. The
// mount outlives the process, as the pinned state must.
func MountBPFFS(pinDir string) (bool, error) { return mountBPFFS(BPFFSRoot, pinDir) }

func mountBPFFS(root, pinDir string) (bool, error) {
	if pinDir == "" {
		return false, nil
	}
	rel, err := filepath.Rel(root, filepath.Clean(pinDir))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return false, nil
	}
	if fsType(pinDir) == unix.BPF_FS_MAGIC || fsType(root) != unix.SYSFS_MAGIC {
		return false, nil
	}
	// Two agents starting at once must not stack two bpffs instances (the
	// second would hide the first's pins): the check and the mount happen
	// under a lock on the bare directory. A process that opens the path
	// after the mount locks the bpffs root instead, and finds it mounted.
	d, err := os.Open(root)
	if err != nil {
		return false, nil
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return false, fmt.Errorf("lock %s: %w", root, err)
	}
	defer func() { _ = unix.Flock(int(d.Fd()), unix.LOCK_UN) }()
	if fsType(root) != unix.SYSFS_MAGIC {
		return false, nil
	}
	beforeMount()
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return false, nil
		}
		return false, fmt.Errorf("mount a bpf filesystem at %s for capture.pin_dir %s: %w (mount it: mount -t bpf -o mode=0700 bpf %s)", root, pinDir, err, root)
	}
	return true, nil
}

// beforeMount widens the window between check and mount in the race test.
var beforeMount = func() {}

// fsType is the filesystem magic of path (0 when it cannot be read).
func fsType(path string) uint32 {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return 0
	}
	return uint32(st.Type)
}
