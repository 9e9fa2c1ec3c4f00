package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/errgroup"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
)

// Scenario is an acceptance scenario declared as data
// (deploy/lab/scenarios/*.yaml): a topology, steps, and the expected
// tenant × zone × direction table.
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Catalogue names the reference scenario(s) this one covers.
	Catalogue string `yaml:"catalogue"`
	// Topology is a topology file relative to the scenario's directory.
	Topology string   `yaml:"topology"`
	Steps    []Step   `yaml:"steps"`
	Expect   []Expect `yaml:"expect"`
	// Noise is the largest total any (tenant, zone, direction,
	// external_network) group no expectation covers may reach (default
	// 64KiB: ARP-free IP chatter such as neighbour discovery and VRRP).
	Noise units.ByteSize `yaml:"noise"`
	// Config is appended to the tapflow config the lab writes (YAML
	// sections it does not write itself, e.g. collector:).
	Config string `yaml:"config"`

	topoData []byte
	topoName string
}

// Step is one action; exactly one field is set.
type Step struct {
	// Drive runs transfers in parallel and waits for them.
	Drive []Transfer `yaml:"drive"`
	// Start runs transfers in the background; a later `wait: true` joins.
	Start []Transfer     `yaml:"start"`
	Wait  bool           `yaml:"wait"`
	Sleep units.Duration `yaml:"sleep"`
	// Add / Remove put a server's ports into / take them out of the
	// inventory file (as creating / deleting the server would).
	Add    string `yaml:"add"`
	Remove string `yaml:"remove"`
	// Failover stops keepalived on the amphora holding the VIP of this
	// load balancer and waits for the other to take it.
	Failover string `yaml:"failover"`
	// Unplug deletes a server's taps (Nova deleting the VM); Plug
	// recreates them and waits for tapflow to attach (events.go).
	Unplug string `yaml:"unplug"`
	Plug   string `yaml:"plug"`
	// Regateway moves a router's external gateway to another external
	// network (Neutron router update).
	Regateway *RegatewayStep `yaml:"regateway"`
	// Migrate live-migrates a server to another hypervisor (its taps
	// move; each hypervisor's agent captures its own).
	Migrate *MigrateStep `yaml:"migrate"`
	// Restart stops tapflow — "kill" (SIGKILL) or "term" (SIGTERM) — and
	// starts it again; it adopts the pinned capture state. A scenario with
	// a restart runs with capture.pin_dir on a bpffs of its own (the
	// shipped default under ip netns exec goes with each process), and
	// its last tapflow process stops with --detach: every stop exports,
	// but only a detaching one is exact at the instant while background
	// traffic (VRRP) still crosses the taps.
	Restart string `yaml:"restart"`
}

// MigrateStep names the server and the hypervisor it moves to.
type MigrateStep struct {
	Server string `yaml:"server"`
	To     string `yaml:"to"`
}

// RegatewayStep names the router and its new external network.
type RegatewayStep struct {
	Router  string `yaml:"router"`
	Network string `yaml:"network"`
}

func (s Step) String() string {
	switch {
	case len(s.Drive) > 0:
		return fmt.Sprintf("drive %v", s.Drive)
	case len(s.Start) > 0:
		return fmt.Sprintf("start %v", s.Start)
	case s.Wait:
		return "wait"
	case s.Sleep > 0:
		return "sleep " + s.Sleep.String()
	case s.Add != "":
		return "add " + s.Add
	case s.Remove != "":
		return "remove " + s.Remove
	case s.Failover != "":
		return "failover " + s.Failover
	case s.Unplug != "":
		return "unplug " + s.Unplug
	case s.Plug != "":
		return "plug " + s.Plug
	case s.Regateway != nil:
		return "regateway " + s.Regateway.Router + " → " + s.Regateway.Network
	case s.Migrate != nil:
		return "migrate " + s.Migrate.Server + " → " + s.Migrate.To
	case s.Restart != "":
		return "restart " + s.Restart
	}
	return "(empty step)"
}

// Expect is one expected total: the records matching every field set
// (tenant by project name or "unknown"; lb by name; server by server or
// amphora name) sum to at least Min and at most Max bytes. Bytes is the
// payload shorthand: Min = Bytes, Max = 1.15 × Bytes + 64 KiB.
type Expect struct {
	Tenant          string `yaml:"tenant"`
	Zone            string `yaml:"zone"`
	Dir             string `yaml:"dir"`
	ExternalNetwork string `yaml:"external_network"`
	LB              string `yaml:"lb"`
	LBSegment       *int   `yaml:"lb_segment"`
	Server          string `yaml:"server"`
	// Member is the pool member on this server (flow.v1.1 member_id).
	Member string `yaml:"member"`
	// Port is a port by name: <server>-port<N>, a subport
	// <server>-port<N>-vlan<VID>.
	Port  string          `yaml:"port"`
	Bytes units.ByteSize  `yaml:"bytes"`
	Min   *units.ByteSize `yaml:"min"`
	Max   *units.ByteSize `yaml:"max"`
}

func (e Expect) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("tenant", e.Tenant)
	add("zone", e.Zone)
	add("dir", e.Dir)
	add("external_network", e.ExternalNetwork)
	add("lb", e.LB)
	if e.LBSegment != nil {
		add("lb_segment", fmt.Sprint(*e.LBSegment))
	}
	add("server", e.Server)
	add("member", e.Member)
	add("port", e.Port)
	if len(parts) == 0 {
		return "all records"
	}
	return strings.Join(parts, " ")
}

// bounds returns the byte bounds (max -1: none).
func (e Expect) bounds() (lo, hi int64) {
	hi = -1
	if e.Bytes > 0 {
		lo, hi = int64(e.Bytes), int64(float64(e.Bytes)*1.15)+64<<10
	}
	if e.Min != nil {
		lo = int64(*e.Min)
	}
	if e.Max != nil {
		hi = int64(*e.Max)
	}
	return lo, hi
}

// LoadScenario reads a scenario and its topology from fsys.
func LoadScenario(fsys fs.FS, name string) (*Scenario, error) {
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("lab scenario: %w", err)
	}
	sc := &Scenario{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(sc); err != nil {
		return nil, fmt.Errorf("lab scenario %s: %w", name, err)
	}
	if sc.Name == "" {
		sc.Name = strings.TrimSuffix(path.Base(name), path.Ext(name))
	}
	if sc.Topology == "" {
		return nil, fmt.Errorf("lab scenario %s: topology: missing; name a topology file", name)
	}
	sc.topoName = path.Join(path.Dir(name), sc.Topology)
	if sc.topoData, err = fs.ReadFile(fsys, sc.topoName); err != nil {
		return nil, fmt.Errorf("lab scenario %s: topology: %w", name, err)
	}
	if sc.Noise == 0 {
		sc.Noise = 64 << 10
	}
	for i, s := range sc.Steps {
		n := 0
		for _, set := range []bool{len(s.Drive) > 0, len(s.Start) > 0, s.Wait, s.Sleep > 0, s.Add != "", s.Remove != "", s.Failover != "",
			s.Unplug != "", s.Plug != "", s.Regateway != nil, s.Migrate != nil, s.Restart != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("lab scenario %s: steps[%d]: give exactly one of drive, start, wait, sleep, add, remove, failover, unplug, plug, regateway, migrate, restart", name, i)
		}
		if s.Restart != "" && s.Restart != "kill" && s.Restart != "term" {
			return nil, fmt.Errorf("lab scenario %s: steps[%d]: restart %q: use kill (SIGKILL) or term (SIGTERM)", name, i, s.Restart)
		}
	}
	// Resolve now, so a bad name fails before anything is built.
	l, err := New(sc.topoData, sc.topoName, Options{Prefix: "check"})
	if err != nil {
		return nil, err
	}
	for i, s := range sc.Steps {
		for _, t := range append(slices.Clone(s.Drive), s.Start...) {
			if _, err := l.resolve(t); err != nil {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: %w", name, i, err)
			}
		}
		for _, srv := range []string{s.Add, s.Remove, s.Unplug, s.Plug} {
			if srv != "" && l.Cloud.Server(srv) == nil {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: no server %q", name, i, srv)
			}
		}
		if g := s.Regateway; g != nil {
			if l.Cloud.Router(g.Router) == nil {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: regateway: no router %q", name, i, g.Router)
			}
			if n := l.Cloud.Network(g.Network); n == nil || !n.External {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: regateway: %q is not an external network", name, i, g.Network)
			}
		}
		if m := s.Migrate; m != nil {
			if l.Cloud.Server(m.Server) == nil {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: migrate: no server %q", name, i, m.Server)
			}
			if ns := l.Cloud.HypervisorNS(m.To); ns != l.Cloud.HVNS() && !slices.Contains(l.Cloud.Hypervisors, ns) {
				return nil, fmt.Errorf("lab scenario %s: steps[%d]: migrate: %q is not a hypervisor of the topology", name, i, m.To)
			}
		}
		if s.Failover != "" && l.Cloud.LB(s.Failover) == nil {
			return nil, fmt.Errorf("lab scenario %s: steps[%d]: no load balancer %q", name, i, s.Failover)
		}
	}
	for i, e := range sc.Expect {
		if _, err := l.Cloud.matcher(e); err != nil {
			return nil, fmt.Errorf("lab scenario %s: expect[%d]: %w", name, i, err)
		}
	}
	return sc, nil
}

// ListScenarios lists the *.yaml scenario files in dir of fsys.
func ListScenarios(fsys fs.FS, dir string) ([]string, error) {
	m, err := fs.Glob(fsys, path.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	slices.Sort(m)
	return m, nil
}

// matcher compiles an expectation against the cloud's names.
func (c *Cloud) matcher(e Expect) (func(*schemas.Flow) bool, error) {
	var tenant, lb, server string
	if e.Tenant != "" {
		switch p := c.Project(e.Tenant); {
		case e.Tenant == "unknown":
			tenant = "unknown"
		case p == nil:
			return nil, fmt.Errorf("tenant %q is not a project of the topology (or unknown)", e.Tenant)
		default:
			tenant = p.ID
		}
	}
	if e.LB != "" {
		l := c.LB(e.LB)
		if l == nil {
			return nil, fmt.Errorf("no load balancer %q", e.LB)
		}
		lb = l.ID
	}
	if e.Server != "" {
		if s := c.Server(e.Server); s != nil {
			server = s.ID
		} else if a := c.Amphora(e.Server); a != nil {
			server = a.ComputeID
		} else {
			return nil, fmt.Errorf("no server or amphora %q", e.Server)
		}
	}
	var members map[string]bool
	if e.Member != "" {
		members = map[string]bool{}
		for _, l := range c.LBs {
			for _, m := range l.Members {
				if m.Server != nil && m.Server.Name == e.Member {
					members[m.ID] = true
				}
			}
		}
		if len(members) == 0 {
			return nil, fmt.Errorf("member %q: no load balancer has a member on that server", e.Member)
		}
	}
	var port string
	if e.Port != "" {
		for _, p := range c.Ports {
			if p.Name == e.Port {
				port = p.ID
			}
		}
		if port == "" {
			return nil, fmt.Errorf("port %q: no port of that name (<server>-port<N>, subports <server>-port<N>-vlan<VID>)", e.Port)
		}
	}
	if e.Dir != "" && e.Dir != "tx" && e.Dir != "rx" {
		return nil, fmt.Errorf("dir %q: use tx or rx", e.Dir)
	}
	return func(f *schemas.Flow) bool {
		return (tenant == "" || f.TenantID == tenant) && (e.Zone == "" || f.Zone == e.Zone) &&
			(e.Dir == "" || f.Direction == e.Dir) && (e.ExternalNetwork == "" || f.ExternalNetwork == e.ExternalNetwork) &&
			(lb == "" || f.LBID == lb) && (e.LBSegment == nil || int(f.LBSegment) == *e.LBSegment) &&
			(server == "" || f.ServerID == server) && (members == nil || members[f.MemberID]) &&
			(port == "" || f.PortID == port)
	}, nil
}

// Check is one evaluated assertion.
type Check struct {
	What   string
	Got    int64
	Lo, Hi int64 // Hi -1: no upper bound
	OK     bool
	Note   string
}

func (c Check) String() string {
	verdict := "ok  "
	if !c.OK {
		verdict = "FAIL"
	}
	bound := fmt.Sprintf("≥ %s", human(c.Lo))
	if c.Hi >= 0 {
		bound += fmt.Sprintf(", ≤ %s", human(c.Hi))
	}
	s := fmt.Sprintf("%s %-60s %12d B  (%s)", verdict, c.What, c.Got, bound)
	if c.Note != "" {
		s += "  " + c.Note
	}
	return s
}

// Outcome is what a scenario run found.
type Outcome struct {
	Scenario     string
	Table        []Row
	Checks       []Check
	Conservation Conservation
	Problems     []string // WARN/ERROR lines of tapflow's log
	UpTime       time.Duration
	RunTime      time.Duration
	Total        time.Duration
	DataDir      string
	// Flows are the records read back, StepTimes when each step started,
	// Cloud the resolved topology: for checks beyond the table.
	Flows     []schemas.Flow
	StepTimes []time.Time
	Cloud     *Cloud
}

// Failed counts failed checks (conservation included).
func (o *Outcome) Failed() int {
	n := 0
	for _, c := range o.Checks {
		if !c.OK {
			n++
		}
	}
	if !o.Conservation.OK() {
		n++
	}
	return n
}

// Print writes the table, the checks and conservation.
func (o *Outcome) Print(w io.Writer) {
	fmt.Fprintf(w, "\n== scenario %s: tenant × zone × direction × external_network (from %s/flows)\n", o.Scenario, o.DataDir)
	PrintTable(w, o.Table)
	fmt.Fprintln(w, "\nchecks:")
	for _, c := range o.Checks {
		fmt.Fprintln(w, "  "+c.String())
	}
	fmt.Fprintf(w, "conservation: %s\n", o.Conservation)
	if len(o.Problems) > 0 {
		fmt.Fprintf(w, "tapflow log warnings (%d):\n", len(o.Problems))
		for i, p := range o.Problems {
			if i == 5 {
				fmt.Fprintf(w, "  …\n")
				break
			}
			fmt.Fprintln(w, "  "+p)
		}
	}
	verdict := "PASS"
	if o.Failed() > 0 {
		verdict = fmt.Sprintf("FAIL (%d)", o.Failed())
	}
	fmt.Fprintf(w, "%s %s — lab up %s, run %s, total %s\n", verdict, o.Scenario, o.UpTime.Round(time.Millisecond),
		o.RunTime.Round(time.Millisecond), o.Total.Round(time.Millisecond))
}

// Evaluate checks flows against the scenario's expectations and noise
// bound.
func (sc *Scenario) Evaluate(c *Cloud, flows []schemas.Flow) []Check {
	var out []Check
	type gk struct{ t, z, d, e string }
	covered := map[gk]bool{}
	groups := map[gk]int64{}
	for i := range flows {
		f := &flows[i]
		groups[gk{f.TenantID, f.Zone, f.Direction, f.ExternalNetwork}] += f.Bytes
	}
	for _, e := range sc.Expect {
		match, err := c.matcher(e)
		if err != nil {
			out = append(out, Check{What: e.String(), Note: err.Error()})
			continue
		}
		var sum int64
		for i := range flows {
			if match(&flows[i]) {
				sum += flows[i].Bytes
				f := &flows[i]
				covered[gk{f.TenantID, f.Zone, f.Direction, f.ExternalNetwork}] = true
			}
		}
		lo, hi := e.bounds()
		out = append(out, Check{What: e.String(), Got: sum, Lo: lo, Hi: hi, OK: sum >= lo && (hi < 0 || sum <= hi)})
	}
	keys := make([]gk, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b gk) int {
		return strings.Compare(a.t+a.z+a.d+a.e, b.t+b.z+b.d+b.e)
	})
	for _, k := range keys {
		if covered[k] {
			continue
		}
		// A group no expectation matched: noise, bounded.
		b := groups[k]
		ok := b <= int64(sc.Noise)
		name := fmt.Sprintf("unexpected tenant=%s zone=%s dir=%s external_network=%s", c.tenantName(k.t), k.z, k.d, k.e)
		if !ok || b > 0 {
			out = append(out, Check{What: name, Got: b, Lo: 0, Hi: int64(sc.Noise), OK: ok})
		}
	}
	return out
}

// RunOptions configure RunScenario.
type RunOptions struct {
	Prefix   string
	StateDir string
	Helper   Command // `serve` / `send`
	Tapflow  Command // `run --config FILE`
	DataDir  string  // pipeline output (kept after the run)
	Keep     bool    // leave the lab up afterwards
	Logger   *slog.Logger
	// Register creates the cloud in a real OpenStack first (tapflow then
	// reads its inventory from the APIs).
	Register *RegisterOptions
}

// RunScenario builds the scenario's lab, runs tapflow in it, performs the
// steps, stops tapflow gracefully, reads the Parquet files and evaluates
// the expectations and conservation, then tears the lab down (unless
// Keep). The error reports failures to run; failed checks are in the
// Outcome.
func RunScenario(ctx context.Context, sc *Scenario, o RunOptions) (out *Outcome, err error) {
	start := time.Now()
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	l, err := New(sc.topoData, sc.topoName, Options{Prefix: o.Prefix, StateDir: o.StateDir, Helper: o.Helper, Logger: log, Register: o.Register})
	if err != nil {
		return nil, err
	}
	out = &Outcome{Scenario: sc.Name, DataDir: o.DataDir}
	if err := freshDataDir(o.DataDir); err != nil {
		return nil, err
	}
	if err := l.Up(ctx); err != nil {
		return nil, err
	}
	out.UpTime = time.Since(start)
	if !o.Keep {
		defer func() {
			if derr := l.Down(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, derr)
			}
		}()
	}
	runStart := time.Now()
	pinDir := ""
	if sc.restarts() {
		// Pinned capture state on a bpffs of the lab's own, which
		// outlives each process (ip netns exec replaces /sys, not the
		// lab's directory). Other scenarios run the shipped default.
		mnt := filepath.Join(l.Dir(), "bpffs")
		if err := mountBPF(mnt); err != nil {
			return nil, err
		}
		defer unmountBPF(mnt)
		pinDir = filepath.Join(mnt, "tapflow")
	}
	// One agent per hypervisor; the first writes to DataDir, the others to
	// DataDir/agent-<namespace>. Restart steps restart the first.
	var pipes []*Pipeline
	defer func() {
		for _, p := range pipes {
			p.Close()
		}
	}()
	stopAll := func() error {
		var errs []error
		for _, p := range pipes {
			errs = append(errs, p.Stop(context.WithoutCancel(ctx)))
		}
		return errors.Join(errs...)
	}
	for i, hv := range append([]string{l.Cloud.HVNS()}, l.Cloud.Hypervisors...) {
		po := PipelineOptions{Command: o.Tapflow, DataDir: o.DataDir, Hypervisor: hv, ExtraConfig: sc.Config}
		if i == 0 {
			po.PinDir = pinDir
		} else {
			po.DataDir = filepath.Join(o.DataDir, "agent-"+hv)
		}
		p, err := l.StartPipeline(ctx, po)
		if err != nil {
			return nil, errors.Join(err, stopAll())
		}
		pipes = append(pipes, p)
	}
	p := pipes[0]
	l.pipe = p
	out.StepTimes, err = l.runSteps(ctx, sc.Steps)
	stepErr := err
	if pinDir != "" && stepErr == nil {
		// The last process exports the pinned table at its stop.
		stepErr = p.Restart(ctx, false, true)
	}
	stopErr := stopAll()
	out.RunTime = time.Since(runStart)
	if err := errors.Join(stepErr, stopErr); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	if !l.Registered() {
		// Keep the inventory next to the data: `tapflow report --names`
		// shows project, server and LB names with it after lab down.
		if b, err := os.ReadFile(l.InventoryPath()); err == nil {
			if err := writeAtomic(filepath.Join(p.DataDir(), "inventory.yaml"), b); err != nil {
				return nil, err
			}
		}
	}
	var flows []schemas.Flow
	var sources []string
	for i, q := range pipes {
		fl, err := ReadFlows(q.DataDir())
		if err != nil {
			return nil, err
		}
		// Each agent's records against its own meters: byte-exact per
		// agent, tap and direction.
		c, err := RunConservation(fl, q.DataDir(), q.LogPath())
		if err != nil {
			return nil, err
		}
		sources = append(sources, c.Source)
		if i == 0 {
			out.Conservation = c
		} else {
			out.Conservation = out.Conservation.merge(c)
		}
		flows = append(flows, fl...)
	}
	if len(pipes) > 1 {
		// No record identity twice across the agents either.
		out.Conservation.Duplicates = CheckConservation(flows, nil).Duplicates
		out.Conservation.Source = fmt.Sprintf("%d agents: %s", len(pipes), strings.Join(sources, "; "))
	}
	out.Flows, out.Cloud = flows, l.Cloud
	out.Table = l.Cloud.Table(flows)
	out.Checks = sc.Evaluate(l.Cloud, flows)
	for _, q := range pipes[1:] {
		out.Problems = append(out.Problems, q.Problems()...)
	}
	out.Problems = append(p.Problems(), out.Problems...)
	out.Total = time.Since(start)
	return out, nil
}

// RunSteps performs scenario steps against a running lab.
func (l *Lab) RunSteps(ctx context.Context, steps []Step) error {
	_, err := l.runSteps(ctx, steps)
	return err
}

func (l *Lab) runSteps(ctx context.Context, steps []Step) (times []time.Time, err error) {
	var bg *errgroup.Group
	for i, s := range steps {
		times = append(times, time.Now())
		l.log.Info("step", "n", i, "step", s.String())
		var err error
		switch {
		case len(s.Drive) > 0:
			_, err = l.Drive(ctx, s.Drive)
		case len(s.Start) > 0:
			if bg == nil {
				bg = new(errgroup.Group)
			}
			ts := s.Start
			bg.Go(func() error { _, err := l.Drive(ctx, ts); return err })
		case s.Wait:
			if bg != nil {
				err = bg.Wait()
				bg = nil
			}
		case s.Sleep > 0:
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-time.After(s.Sleep.D()):
			}
		case s.Add != "":
			err = l.SetPresent(s.Add, true)
		case s.Remove != "":
			err = l.SetPresent(s.Remove, false)
		case s.Failover != "":
			_, _, err = l.Failover(ctx, s.Failover)
		case s.Unplug != "":
			err = l.Unplug(ctx, s.Unplug)
		case s.Plug != "":
			err = l.Plug(ctx, s.Plug)
		case s.Regateway != nil:
			err = l.Regateway(ctx, s.Regateway.Router, s.Regateway.Network)
		case s.Migrate != nil:
			err = l.Migrate(ctx, s.Migrate.Server, s.Migrate.To)
		case s.Restart != "":
			if l.pipe == nil {
				err = errors.New("restart: no tapflow pipeline runs in this lab")
				break
			}
			err = l.pipe.Restart(ctx, s.Restart == "kill", false)
		}
		if err != nil {
			if bg != nil {
				bg.Wait()
			}
			return times, fmt.Errorf("steps[%d] (%s): %w", i, s, err)
		}
	}
	if bg != nil {
		return times, bg.Wait()
	}
	return times, nil
}

// restarts reports whether a step restarts tapflow.
func (sc *Scenario) restarts() bool {
	for _, s := range sc.Steps {
		if s.Restart != "" {
			return true
		}
	}
	return false
}

// freshDataDir empties a data directory of an earlier run (one holding the
// tapflow.yaml the lab writes); any other non-empty directory is refused.
func freshDataDir(dir string) error {
	if dir == "" {
		return errors.New("lab: RunOptions.DataDir is required (where tapflow writes Parquet)")
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "tapflow.yaml")); err != nil {
		return fmt.Errorf("lab: data directory %s is not empty and not a lab run's; pick an empty or new directory", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("lab: clear the previous run in %s: %w", dir, err)
	}
	return nil
}
