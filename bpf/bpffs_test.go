//go:build linux

package bpf

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// TestMountBPFFS runs MountBPFFS in a private mount namespace (unshare
// --mount --propagation private) whose /sys/fs/bpf is made bare, so the
// host's mounts are never touched: the parent checks that the host's
// /sys/fs/bpf is what it was. In the namespace, table-driven: a bare
// /sys/fs/bpf gets one bpffs (mode 0700) on which preparePinDir then
// succeeds, even when eight agents race for it; a pin_dir elsewhere, one
// already on bpffs, or a /sys/fs/bpf holding another filesystem (the
// unit's TemporaryFileSystem) is left alone.
func TestMountBPFFS(t *testing.T) {
	if os.Getenv("TAPFLOW_BPFFS_CHILD") == "1" {
		mountBPFFSCases(t)
		return
	}
	prereq.Root(t, "it mounts in a private mount namespace")
	unshare := prereq.Command(t, "unshare", "make deps (deploy/scripts/deps.sh) installs Debian's util-linux package")
	before := fsType(BPFFSRoot)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "--", self, "-test.run", "^TestMountBPFFS$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "TAPFLOW_BPFFS_CHILD=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS: TestMountBPFFS") {
		t.Fatalf("child: %v", err)
	}
	if after := fsType(BPFFSRoot); after != before {
		t.Fatalf("the host's %s changed from fs type %#x to %#x", BPFFSRoot, before, after)
	}
}

// mountBPFFSCases runs inside the private mount namespace.
func mountBPFFSCases(t *testing.T) {
	bare := func(t *testing.T) {
		t.Helper()
		for i := 0; fsType(BPFFSRoot) != unix.SYSFS_MAGIC; i++ {
			if i == 8 {
				t.Fatalf("%s is still fs type %#x after 8 unmounts", BPFFSRoot, fsType(BPFFSRoot))
			}
			if err := unix.Unmount(BPFFSRoot, unix.MNT_DETACH); err != nil {
				t.Fatalf("make %s bare: %v", BPFFSRoot, err)
			}
		}
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T) (pinDir string)
		agents  int
		mounted bool   // one of the calls mounts
		want    uint32 // fs type of /sys/fs/bpf afterwards
	}{
		{"bare sysfs dir, default pin_dir", func(*testing.T) string { return BPFFSRoot + "/tapflow" }, 1, true, unix.BPF_FS_MAGIC},
		{"bare, pin_dir is the root itself", func(*testing.T) string { return BPFFSRoot }, 1, true, unix.BPF_FS_MAGIC},
		{"bare, eight agents at once", func(*testing.T) string { return BPFFSRoot + "/tapflow" }, 8, true, unix.BPF_FS_MAGIC},
		{"already mounted", func(t *testing.T) string {
			if err := unix.Mount("bpf", BPFFSRoot, "bpf", 0, "mode=0700"); err != nil {
				t.Fatal(err)
			}
			return BPFFSRoot + "/tapflow"
		}, 1, false, unix.BPF_FS_MAGIC},
		{"pin_dir elsewhere", func(t *testing.T) string { return filepath.Join(t.TempDir(), "pins") }, 1, false, unix.SYSFS_MAGIC},
		{"pin_dir outside but prefixed", func(*testing.T) string { return BPFFSRoot + "-other/tapflow" }, 1, false, unix.SYSFS_MAGIC},
		{"another filesystem on /sys/fs/bpf (the unit's sandbox)", func(t *testing.T) string {
			if err := unix.Mount("tmpfs", BPFFSRoot, "tmpfs", 0, "mode=0755"); err != nil {
				t.Fatal(err)
			}
			return BPFFSRoot + "/tapflow"
		}, 1, false, unix.TMPFS_MAGIC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bare(t)
			t.Cleanup(func() { bare(t) })
			pinDir := tc.setup(t)
			// Every racer passes the check before any mounts (without
			// the lock all of them would mount).
			beforeMount = func() { time.Sleep(50 * time.Millisecond) }
			defer func() { beforeMount = func() {} }()
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				mounted int
			)
			for range tc.agents {
				wg.Go(func() {
					m, err := MountBPFFS(pinDir)
					if err != nil {
						t.Error(err)
					}
					if m {
						mu.Lock()
						mounted++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if want := map[bool]int{true: 1, false: 0}[tc.mounted]; mounted != want {
				t.Errorf("%d calls mounted, want %d", mounted, want)
			}
			if got := fsType(BPFFSRoot); got != tc.want {
				t.Errorf("%s is fs type %#x, want %#x", BPFFSRoot, got, tc.want)
			}
			if n := bpfMountsAt(t, BPFFSRoot); tc.want == unix.BPF_FS_MAGIC && n != 1 {
				t.Errorf("%d bpf mounts at %s, want exactly 1 (none stacked)", n, BPFFSRoot)
			}
			if !tc.mounted {
				return
			}
			st, err := os.Stat(BPFFSRoot)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o700 {
				t.Errorf("%s mode %v, want 0700 (as systemd mounts it)", BPFFSRoot, st.Mode().Perm())
			}
			// The agent's own check now passes where it failed before.
			if _, err := preparePinDir(pinDir); err != nil {
				t.Errorf("preparePinDir after the mount: %v", err)
			}
			if m, err := MountBPFFS(pinDir); m || err != nil {
				t.Errorf("second MountBPFFS = %v, %v; want false, nil", m, err)
			}
		})
	}
}

// bpfMountsAt counts the bpf mounts at dir in this mount namespace.
func bpfMountsAt(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// id parent major:minor root mountpoint options ... - fstype source
		for i, w := range f {
			if w == "-" && i+1 < len(f) && len(f) > 4 && f[4] == dir && f[i+1] == "bpf" {
				n++
			}
		}
	}
	return n
}

// TestPinDurable: a pin directory outlives the agent exactly when its
// bpffs instance (device number) is mounted in the host's mount namespace
// (/proc/1/mountinfo, read only in the initial PID namespace); a real
// bpffs mount and crafted mountinfo files drive each branch.
func TestPinDurable(t *testing.T) {
	prereq.Root(t, "it mounts a bpffs")
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	var ns unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &ns); err != nil || ns.Ino != procPIDInitIno {
		t.Fatalf("the test must run in the initial PID namespace (ns inode %d, %v)", ns.Ino, err)
	}
	dir := t.TempDir()
	n := 0
	info := func(lines ...string) string {
		n++
		p := filepath.Join(dir, fmt.Sprint(n, ".mountinfo"))
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := "22 26 0:21 / /sys rw,relatime shared:7 - sysfs sysfs rw"
	withBPF := info(root, "40 22 "+dev+" / /sys/fs/bpf rw,nosuid shared:12 - bpf bpf rw,mode=700")
	otherBPF := info(root, "40 22 0:999 / /sys/fs/bpf rw - bpf bpf rw,mode=700")
	sameDevNotBPF := info(root, "40 22 "+dev+" / /x rw - tmpfs tmpfs rw")
	ownPIDNS := filepath.Join(dir, "not-the-initial-pid-ns")
	os.WriteFile(ownPIDNS, nil, 0o600)
	pin := filepath.Join(mnt, "tapflow") // not created yet: its parent is checked
	tests := []struct {
		name        string
		pinDir      string
		mountedHere bool
		pidNS       string
		mountinfo   string
		durable     bool
		why         string
	}{
		{"host: bpffs in pid 1's mounts", pin, false, "/proc/self/ns/pid", withBPF, true, "host's mount namespace"},
		{"host: mounted by the agent in the host's namespace", pin, true, "/proc/self/ns/pid", withBPF, true, "host's mount namespace"},
		{"ip netns exec: mounted by the agent, not in pid 1's", pin, true, "/proc/self/ns/pid", otherBPF, false, "mounted the bpffs itself in a private mount namespace"},
		{"private namespace's own bpffs", pin, false, "/proc/self/ns/pid", otherBPF, false, "only in this private mount namespace"},
		{"same device, another filesystem type", pin, false, "/proc/self/ns/pid", sameDevNotBPF, false, "only in this private"},
		{"container: mounted by the agent", pin, true, ownPIDNS, withBPF, false, "inside a container"},
		{"container: found mounted (bind mount assumed)", pin, false, ownPIDNS, otherBPF, true, "assumed"},
		{"mountinfo unreadable, mounted by the agent", pin, true, "/proc/self/ns/pid", filepath.Join(dir, "missing"), false, "inside a container"},
		{"pin_dir not on bpffs", filepath.Join(dir, "tapflow"), false, "/proc/self/ns/pid", withBPF, false, "not on a bpf filesystem"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := pinDurable(tc.pinDir, tc.mountedHere, tc.pidNS, tc.mountinfo)
			if got.Durable != tc.durable || !strings.Contains(got.Reason, tc.why) {
				t.Errorf("got %+v, want durable %v with reason containing %q", got, tc.durable, tc.why)
			}
		})
	}
	// The real thing: this test's mount is in the host's mount namespace.
	if got := PinDurable(pin, false); !got.Durable {
		t.Errorf("PinDurable of a bpffs mounted in the initial mount namespace: %+v", got)
	}
}

// FuzzMountedIn: /proc/1/mountinfo is read as the kernel writes it, but a
// hostile or odd line (a mount point with spaces escaped, a huge line,
// missing fields) must neither panic nor find a bpffs that is not there:
// found means a line with that device and filesystem type bpf after "-".
func FuzzMountedIn(f *testing.F) {
	f.Add("36 25 0:32 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:13 - bpf bpf rw,mode=700\n", uint32(0), uint32(32))
	f.Add("36 25 0:32 / /sys/fs/bpf rw - tmpfs none rw\n", uint32(0), uint32(32))
	f.Add("0:32 - bpf\n", uint32(0), uint32(32))
	f.Add("1 2 0:32 / /a\\040b rw - bpf bpf rw\n1 2 0:33 / /c rw - bpf\n", uint32(0), uint32(33))
	f.Add("", uint32(0), uint32(0))
	f.Add(strings.Repeat("x", 70<<10)+"\n36 25 0:32 / /sys/fs/bpf rw - bpf bpf rw\n", uint32(0), uint32(32))
	f.Fuzz(func(t *testing.T, info string, major, minor uint32) {
		p := filepath.Join(t.TempDir(), "mountinfo")
		if err := os.WriteFile(p, []byte(info), 0o600); err != nil {
			t.Fatal(err)
		}
		found, err := mountedIn(p, major, minor)
		if !found {
			return
		}
		if err != nil {
			t.Fatalf("found with an error: %v", err)
		}
		want := fmt.Sprintf("%d:%d", major, minor)
		for _, line := range strings.Split(info, "\n") {
			fields := strings.Fields(line)
			if len(fields) < 3 || fields[2] != want {
				continue
			}
			for i := range len(fields) - 1 {
				if fields[i] == "-" && fields[i+1] == "bpf" {
					return
				}
			}
		}
		t.Fatalf("mountedIn(%d:%d) found a bpffs in %q", major, minor, info)
	})
}
