//go:build linux

package bpf

import (
	"bufio"
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

// PinDurability says whether the bpffs a pin directory lies on outlives
// the agent, so that a next start can adopt what is pinned there.
type PinDurability struct {
	Durable bool
	// Reason says why, for the log, /readyz and the docs' fix.
	Reason string
}

// procPIDInitIno is the inode of the initial PID namespace
// (PROC_PID_INIT_INO, fixed since Linux 3.8): in it, /proc/1 is the
// host's init, whose mount namespace outlives every agent.
const procPIDInitIno = 0xEFFFFFFC

// PinDurable tells whether pinDir's bpffs outlives this process.
// mountedHere is MountBPFFS's result: this process mounted it.
//
// A bpffs instance lives while it is mounted somewhere. The robust test
// is therefore not "which mount namespace am I in" (under ip netns exec
// and unshare -m /proc/1 is still the host's init, and its ns links may
// be unreadable even for root) but "is this very bpffs instance (its
// device number) mounted in the host's mount namespace", read from
// /proc/1/mountinfo: the host's /sys/fs/bpf, seen directly, inherited
// by unshare -m or bind-mounted into a container, is; a bpffs mounted in
// a private mount namespace (ours under ip netns exec, a container's
// own) is not. That needs /proc/1 to be the host's init, i.e. the
// initial PID namespace and readable. When the host's mounts are out of
// sight (a container with a PID namespace of its own; the systemd unit's
// ProtectProc=invisible hides /proc/1) a bpffs this process mounted is
// its namespace's and goes with it; one it found is taken for the host's,
// bind-mounted as the unit and docs/containers.md do (not verifiable).
func PinDurable(pinDir string, mountedHere bool) PinDurability {
	return pinDurable(pinDir, mountedHere, "/proc/self/ns/pid", "/proc/1/mountinfo")
}

func pinDurable(pinDir string, mountedHere bool, pidNS, initMountinfo string) PinDurability {
	dir := existingAncestor(filepath.Clean(pinDir))
	var st unix.Stat_t
	if fsType(dir) != unix.BPF_FS_MAGIC || unix.Stat(dir, &st) != nil {
		return PinDurability{Reason: fmt.Sprintf("%s is not on a bpf filesystem", pinDir)}
	}
	var ns unix.Stat_t
	if unix.Stat(pidNS, &ns) == nil && ns.Ino == procPIDInitIno {
		found, err := mountedIn(initMountinfo, unix.Major(st.Dev), unix.Minor(st.Dev))
		switch {
		case err != nil:
			// Fall through to what this process knows.
		case found:
			return PinDurability{Durable: true, Reason: "the bpffs is mounted in the host's mount namespace"}
		case mountedHere:
			return PinDurability{Reason: "this agent mounted the bpffs itself in a private mount namespace (ip netns exec, unshare -m): it goes away when the agent exits"}
		default:
			return PinDurability{Reason: "the bpffs is mounted only in this private mount namespace, not in the host's: it goes away with the namespace"}
		}
	}
	if mountedHere {
		return PinDurability{Reason: "this agent mounted the bpffs itself inside a container (a PID and mount namespace of its own): it goes away with the container"}
	}
	return PinDurability{Durable: true, Reason: "assumed: the host's mounts are out of sight (a PID namespace of its own, or /proc/1 hidden as by systemd's ProtectProc=invisible); the bpffs found mounted is taken for the host's, bind-mounted"}
}

// existingAncestor is p or its nearest existing parent (the pin directory
// is created at load, after this check).
func existingAncestor(p string) string {
	for {
		if _, err := os.Stat(p); err == nil || p == "/" || p == "." {
			return p
		}
		p = filepath.Dir(p)
	}
}

// mountedIn reports whether a bpf filesystem with device major:minor is
// mounted in the mount namespace whose mountinfo is at path.
func mountedIn(path string, major, minor uint32) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf("%d:%d", major, minor)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional…] - fstype source super
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[2] != want {
			continue
		}
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && fields[i+1] == "bpf" {
				return true, nil
			}
		}
	}
	return false, sc.Err()
}

// OnBPFFS reports whether pinDir (or, before it exists, its nearest
// existing parent) is on a bpf filesystem.
func OnBPFFS(pinDir string) bool {
	return fsType(existingAncestor(filepath.Clean(pinDir))) == unix.BPF_FS_MAGIC
}

// BelowBPFFSRoot reports whether pinDir lies below /sys/fs/bpf.
func BelowBPFFSRoot(pinDir string) bool {
	return strings.HasPrefix(filepath.Clean(pinDir), BPFFSRoot+"/")
}
