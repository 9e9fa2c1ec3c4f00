package parquet

import (
	"context"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// otherGroup is a group of this host the process is not running as (and,
// without root, one of its supplementary groups: chown gives no other).
func otherGroup(t *testing.T) (string, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		gs, _ := os.Getgroups()
		for _, g := range gs {
			if gr, err := user.LookupGroupId(strconv.Itoa(g)); err == nil && g != os.Getgid() {
				return gr.Name, g
			}
		}
		prereq.Root(t, "to give files a group the user is not in (or a user with a supplementary group)")
	}
	b, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 {
			continue
		}
		if gid, err := strconv.Atoi(f[2]); err == nil && gid != os.Getgid() {
			return f[0], gid
		}
	}
	t.Fatal("no group other than the process's in /etc/group")
	return "", 0
}

// TestFileModes: committed Parquet files are 0640 in 0750 directories
// whatever the umask (0 would give 0666/0777, 077 would lock the reader
// group out), owned by collector.file_group when set; a group that does
// not exist is refused with the fix.
func TestFileModes(t *testing.T) {
	group, gid := otherGroup(t)
	for _, tc := range []struct {
		name  string
		umask int
		group string
		gid   int
	}{
		{"umask 0", 0, "", os.Getgid()},
		{"umask 077 with a reader group", 0o077, group, gid},
		{"umask 022, group by number", 0o022, strconv.Itoa(gid), gid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := syscall.Umask(tc.umask)
			defer syscall.Umask(old)
			cfg := testConfig(t)
			cfg.FileGroup = tc.group
			e := newSink(t, cfg)
			r := start(context.Background(), e.sink)
			a := newAcks()
			r.send(a.batches(parquettest.Flows(parquettest.Spec{Records: 100}), 50, 1)...)
			r.close(t)
			if ok, failed := a.state(); ok != 2 || failed != 0 {
				t.Fatalf("acks ok=%d failed=%d", ok, failed)
			}
			files := 0
			err := filepath.WalkDir(cfg.Output, func(p string, d fs.DirEntry, err error) error {
				if err != nil || p == cfg.Output {
					return err
				}
				st, err := os.Stat(p)
				if err != nil {
					return err
				}
				want := os.FileMode(0o640)
				if d.IsDir() {
					want = 0o750
				} else {
					files++
				}
				if st.Mode().Perm() != want {
					t.Errorf("%s: mode %04o, want %04o", p, st.Mode().Perm(), want)
				}
				if g := int(st.Sys().(*syscall.Stat_t).Gid); g != tc.gid {
					t.Errorf("%s: group %d, want %d", p, g, tc.gid)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if files == 0 {
				t.Fatal("no file written")
			}
		})
	}
	t.Run("missing group", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.FileGroup = "no-such-group-tapflow"
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "file_group") || !strings.Contains(err.Error(), "groupadd no-such-group-tapflow") {
			t.Fatalf("err = %v", err)
		}
	})
}
