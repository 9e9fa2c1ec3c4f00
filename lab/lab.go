package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"
)

// Options configure a Lab.
type Options struct {
	// Prefix names every namespace "<prefix>-…" (default "tfl").
	Prefix string
	// StateDir holds the inventory, configs, logs and the topology of a
	// running lab (default /run/tapflow-lab/<prefix>).
	StateDir string
	// Helper runs `serve` and `send` inside namespaces (required for Up
	// and Drive).
	Helper Command
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Register, when set, makes Up create the cloud in a real OpenStack
	// first and build the namespaces from what it made (register.go).
	Register *RegisterOptions
}

// Lab is one cloud in namespaces. New validates and creates nothing; Up
// builds it; Down removes it.
type Lab struct {
	Cloud *Cloud
	opts  Options
	dir   string
	log   *slog.Logger
	ncmd  atomic.Int64
	topo  []byte

	mu      sync.Mutex
	reg     *Registration // nil: the lab's own static inventory
	present map[string]bool
	procs   map[string]chan struct{} // spawned processes by name, closed at exit
	pipe    *Pipeline                // the tapflow a scenario runs (restart steps)
}

// stateMarker marks a state directory as the lab's own.
const stateMarker = "lab.yaml"

type stateFile struct {
	Prefix   string          `yaml:"prefix"`
	Source   string          `yaml:"source"`
	Created  time.Time       `yaml:"created"`
	Present  map[string]bool `yaml:"present,omitempty"`
	Topology string          `yaml:"topology"`
	// Registration is set when the cloud was created in OpenStack.
	Registration *Registration `yaml:"registration,omitempty"`
}

// New resolves topology data (a topology file's bytes; name is used in
// errors) for the prefix in opts. Nothing is created.
func New(data []byte, name string, opts Options) (*Lab, error) {
	if opts.Prefix == "" {
		opts.Prefix = "tfl"
	}
	t, err := ParseTopology(data, name)
	if err != nil {
		return nil, err
	}
	c, err := Resolve(t, opts.Prefix)
	if err != nil {
		return nil, err
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(DefaultStateRoot, opts.Prefix)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Lab{Cloud: c, opts: opts, dir: opts.StateDir, log: log.With("lab", opts.Prefix), topo: data, present: map[string]bool{}}, nil
}

// Open attaches to the running lab of opts.Prefix (built by Up, possibly
// by another process) through its state directory.
func Open(opts Options) (*Lab, error) {
	if opts.Prefix == "" {
		opts.Prefix = "tfl"
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(DefaultStateRoot, opts.Prefix)
	}
	b, err := os.ReadFile(filepath.Join(opts.StateDir, stateMarker))
	if err != nil {
		return nil, fmt.Errorf("lab %s: no running lab (%w); start one with `tapflow lab up`", opts.Prefix, err)
	}
	var st stateFile
	if err := yaml.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("lab %s: corrupt state %s: %w; run `tapflow lab down --prefix %s`", opts.Prefix, opts.StateDir, err, opts.Prefix)
	}
	l, err := New([]byte(st.Topology), st.Source, opts)
	if err != nil {
		return nil, err
	}
	if st.Present != nil {
		l.present = st.Present
	}
	if st.Registration != nil {
		if err := l.Cloud.Bind(st.Registration); err != nil {
			return nil, err
		}
		l.reg = st.Registration
	}
	return l, nil
}

// Dir is the state directory.
func (l *Lab) Dir() string { return l.dir }

// InventoryPath is the static inventory file the lab keeps current.
func (l *Lab) InventoryPath() string { return filepath.Join(l.dir, "inventory.yaml") }

// Registered reports whether the cloud was created in OpenStack (lab up
// --register): tapflow then reads the APIs, not InventoryPath.
func (l *Lab) Registered() bool { return l.reg != nil }

// CloudsPath is the clouds.yaml of a registered lab (entry "lab").
func (l *Lab) CloudsPath() string { return filepath.Join(l.dir, "clouds.yaml") }

// Prefix is the namespace prefix.
func (l *Lab) Prefix() string { return l.Cloud.Prefix }

func (l *Lab) saveState() error {
	l.mu.Lock()
	st := stateFile{Prefix: l.Cloud.Prefix, Source: l.Cloud.Topology.file, Created: time.Now().UTC(), Present: l.present,
		Topology: string(l.topo), Registration: l.reg}
	l.mu.Unlock()
	b, err := yaml.Marshal(st)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(l.dir, stateMarker), b)
}

// SetPresent adds (true) or removes (false) a server's ports and the
// server itself in the inventory file, as Nova/Neutron creating or
// deleting it would; the file is replaced atomically.
func (l *Lab) SetPresent(server string, present bool) error {
	if l.Cloud.Server(server) == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	if l.reg != nil {
		return fmt.Errorf("lab: server %s: the inventory of a registered lab comes from OpenStack; create or delete its port there instead", server)
	}
	l.mu.Lock()
	l.present[server] = present
	p := maps(l.present)
	l.mu.Unlock()
	if err := l.Cloud.WriteInventory(l.InventoryPath(), p); err != nil {
		return err
	}
	return l.saveState()
}

func maps(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Preflight checks what Up needs: root, the Debian tools, and that no lab
// with this prefix exists.
func (l *Lab) Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("lab: needs root (network namespaces, veths, nftables); run as root or use `make demo` for the synthetic demo")
	}
	need := []string{"ip"}
	if len(l.Cloud.Routers) > 0 {
		need = append(need, "nft")
	}
	for _, lb := range l.Cloud.LBs {
		need = append(need, "haproxy")
		if lb.ActiveStandby {
			need = append(need, "keepalived")
		}
	}
	var miss []string
	for _, b := range need {
		if _, err := exec.LookPath(b); err != nil && !contains(miss, b) {
			miss = append(miss, b)
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("lab: %s not found; install the Debian packages: %s", strings.Join(miss, ", "), InstallHint)
	}
	if l.opts.Helper.Path == "" {
		return errors.New("lab: no helper command to run the lab's servers (Options.Helper)")
	}
	ns, err := ListNamespaces(l.Cloud.Prefix)
	if err != nil {
		return err
	}
	if len(ns) > 0 {
		return fmt.Errorf("lab %s already exists (%s); remove it with `tapflow lab down --prefix %s` or pick another --prefix",
			l.Cloud.Prefix, strings.Join(ns, ", "), l.Cloud.Prefix)
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Down removes the lab (see Teardown).
func (l *Lab) Down(ctx context.Context) error {
	_, err := Teardown(ctx, l.Cloud.Prefix, l.dir, l.log)
	return err
}
