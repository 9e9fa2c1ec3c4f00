package prereq

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nonRootUser runs the check; kept between runs so its Go build and
// module caches (in its home) make the next run fast. userdel -r removes
// it.
const nonRootUser = "tapflowtest"

// TestShortAsNonRoot: `go test -short` of the package full of root-only
// tests (eBPF loads, bpffs mounts) and of this one passes as a non-root user,
// each such test skipping with its prerequisite named, as `make
// test-short` must for a developer without privileges. Run as root (make
// test): it creates the user when absent and runs a copy of the working
// tree as that user, with CI unset and the user's own Go caches.
func TestShortAsNonRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds two packages with -race as another user")
	}
	if os.Geteuid() != 0 {
		t.Skip("already not root: this run is itself the check") // deliberate skip: it needs root only to switch to a non-root user
	}
	u := ensureUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	src := copyTree(t, filepath.Join("..", "..", ".."), uid, gid)

	goBin := Command(t, "go", "install Go (https://go.dev/dl) in /usr/local/go")
	proxy, err := exec.Command(goBin, "env", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env GOPROXY: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	pkgs := []string{"./bpf/", "./internal/testkit/prereq/"}
	cmd := exec.CommandContext(ctx, goBin, append([]string{"test", "-short", "-race", "-count=1", "-v"}, pkgs...)...)
	cmd.Dir = src
	// The user's own caches in its home (root's are not readable), modules
	// from the proxy root uses; CI unset, as in a developer's shell.
	cmd.Env = []string{
		"PATH=" + filepath.Dir(goBin) + ":/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + u.HomeDir, "USER=" + u.Username,
		"GOPROXY=" + strings.TrimSpace(string(proxy)), "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local",
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{uint32(gid)}}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("go test -short %s as %s (uid %d): %v\n%s", strings.Join(pkgs, " "), u.Username, uid, err, out.String())
	}
	t.Logf("go test -short as %s: %s", u.Username, took.Round(time.Second))
	for _, want := range []string{
		"--- SKIP: TestMountBPFFS", // the test make test-short failed on (issue 21)
		fmt.Sprintf("%sroot (running as uid %d): it mounts in a private mount namespace", SkipPrefix, uid),
		"ok  \tgithub.com/tapflow/tapflow/bpf\t",
		"ok  \tgithub.com/tapflow/tapflow/internal/testkit/prereq\t",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("go test -short as %s: output lacks %q", u.Username, want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}

// ensureUser returns nonRootUser, creating it (with a home) when absent.
func ensureUser(t *testing.T) *user.User {
	t.Helper()
	if u, err := user.Lookup(nonRootUser); err == nil {
		return u
	}
	useradd := Command(t, "useradd", "make deps (deploy/scripts/deps.sh) installs Debian's passwd package")
	if out, err := exec.Command(useradd, "--create-home", "--shell", "/bin/sh", nonRootUser).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v %s", nonRootUser, err, out)
	}
	u, err := user.Lookup(nonRootUser)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// copyTree copies the working tree at root (the files git knows, tracked
// or not ignored) into a fresh directory owned by uid:gid: the checkout
// may sit where the user cannot read it (/root), and a developer owns
// theirs.
func copyTree(t *testing.T, root string, uid, gid int) string {
	t.Helper()
	git := Command(t, "git", "make deps installs Debian's git package")
	list, err := exec.Command(git, "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	dst, err := os.MkdirTemp("", "tapflow-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dst) })
	n := 0
	for _, rel := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		from := filepath.Join(root, rel)
		st, err := os.Lstat(from)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the working tree, a symlink or a submodule
		}
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n < 100 {
		t.Fatalf("copied %d files from %s: not the repository", n, root)
	}
	err = filepath.WalkDir(dst, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatalf("chown %s: %v", dst, err)
	}
	return dst
}
