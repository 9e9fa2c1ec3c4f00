package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/internal/yamlpath"
	"github.com/tapflow/tapflow/transport"
)

// Load reads path over the defaults, resolves derived values and validates
// the whole file. The error lists every problem, one per line, each with
// the field path and the fix.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Parse(data)
}

// Parse is Load on bytes.
func Parse(data []byte) (Config, error) { return ParseWith(data, nil) }

// ParseWith is Parse with override (command-line flags) applied after
// decoding and before resolving and validating. ${NAME} and
// ${NAME:-default} are expanded from the environment first. Problems of
// every kind are listed together: unset variables, values of the wrong
// type (the field keeps its default, and the checks of that field are
// left out) and invalid values. No value that came from the environment
// is shown in them.
func ParseWith(data []byte, override func(*Config)) (Config, error) {
	exp, envErr := expandEnv(data, os.LookupEnv)
	cfg, typeErr, err := decode(exp.data, exp.hideYAMLValue)
	if err != nil {
		return cfg, exp.redact(errors.Join(envErr, err))
	}
	if override != nil {
		override(&cfg)
	}
	cfg.Resolve()
	var e units.Errors
	e.Merge("", envErr)
	e.Merge("", typeErr)
	bad := problemPaths(envErr, typeErr)
	for _, one := range unwrapAll(cfg.Validate()) {
		var fe *units.FieldError
		if errors.As(one, &fe) && bad[fe.Path] {
			continue
		}
		e.Merge("", one)
	}
	return cfg, exp.redact(e.Err())
}

// Decode reads data over the defaults (after ${NAME} expansion) without
// resolving or validating.
func Decode(data []byte) (Config, error) {
	exp, envErr := expandEnv(data, os.LookupEnv)
	cfg, typeErr, err := decode(exp.data, exp.hideYAMLValue)
	return cfg, exp.redact(errors.Join(envErr, typeErr, err))
}

// decode reads data over the defaults. typeErrs are values yaml could not
// store (unknown keys, wrong types): decoding goes on past them, so they
// are listed with the rest. err is a document that is not YAML at all.
// hide rewrites the decoder's message about a line (see hideYAMLValue).
func decode(data []byte, hide func(line int, msg string) string) (cfg Config, typeErrs, err error) {
	cfg = Default()
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	derr := dec.Decode(&cfg)
	if derr == nil {
		return cfg, nil, nil
	}
	var te *yaml.TypeError
	if !errors.As(derr, &te) {
		msg := derr.Error()
		if m := yamlLineRE.FindStringSubmatch(strings.TrimPrefix(msg, "yaml: ")); m != nil {
			line, _ := strconv.Atoi(m[1])
			msg = hide(line, msg)
		}
		return cfg, nil, fmt.Errorf("config is not valid YAML: %s", msg)
	}
	// yaml.v3 skips a whole mapping that repeats a key, so everything in
	// it would go unchecked: decode again with the repeats blanked out
	// (the first occurrence wins) and list both passes' problems.
	if dup, ok := withoutDuplicateKeys(data); ok {
		cfg2 := Default()
		dec := yaml.NewDecoder(bytes.NewReader(dup))
		dec.KnownFields(true)
		var te2 *yaml.TypeError
		if derr := dec.Decode(&cfg2); derr == nil || errors.As(derr, &te2) {
			msgs := te.Errors
			if te2 != nil {
				msgs = append(msgs, te2.Errors...)
			}
			return cfg2, yamlErrors(data, &yaml.TypeError{Errors: msgs}, hide), nil
		}
	}
	return cfg, yamlErrors(data, te, hide), nil
}

// withoutDuplicateKeys blanks the lines of every repeated key of a block
// mapping and its value (line numbers stay), so the document decodes.
// ok is false when there is no repeat, or one in a flow mapping ({a: 1,
// a: 2}: it shares its line with others).
func withoutDuplicateKeys(data []byte) ([]byte, bool) {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return nil, false
	}
	lines := strings.SplitAfter(string(data), "\n")
	blanked, ok := false, true
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			seen := map[string]bool{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if !seen[k.Value] {
					seen[k.Value] = true
					continue
				}
				if n.Style&yaml.FlowStyle != 0 {
					ok = false
					return
				}
				for l := k.Line; l <= lastLine(n.Content[i+1]) && l <= len(lines); l++ {
					lines[l-1] = "\n"
				}
				blanked = true
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	if !blanked || !ok {
		return nil, false
	}
	return []byte(strings.Join(lines, "")), true
}

// lastLine is the last line a node's subtree starts a node on.
func lastLine(n *yaml.Node) int {
	l := n.Line
	for _, c := range n.Content {
		l = max(l, lastLine(c))
	}
	return l
}

// problemPaths are the fields an error list is about.
func problemPaths(errs ...error) map[string]bool {
	out := map[string]bool{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		for _, one := range unwrapAll(err) {
			var fe *units.FieldError
			if errors.As(one, &fe) {
				out[fe.Path] = true
			}
		}
	}
	return out
}

// Resolve fills the values derived from others (agent id from node,
// collector output from data_dir, ack_wait from roll_age).
func (c *Config) Resolve() {
	if c.Agent.ID == "" {
		c.Agent.ID = c.Node
	}
	if c.Agent.Spool.Dir == "" && c.Agent.Spool.Enabled() {
		c.Agent.Spool.Dir = filepath.Join(c.AgentStateDir(), "spool")
	}
	if c.Collector.Parquet.Output == "" {
		c.Collector.Parquet.Output = c.DataDir
	}
	c.resolveOutput()
	c.resolveBilling()
	if c.Collector.Parquet.Writer == "" {
		c.Collector.Parquet.Writer = c.Node
	}
	if c.Collector.Consumer.AckWait == 0 {
		c.Collector.Consumer.AckWait = units.Duration(c.Collector.Parquet.RollAge.D() + 2*time.Minute)
	}
	// EnsureStreams creates the collector's consumers before agents
	// publish (interest retention), in agent processes too: they read
	// the same file.
	c.NATS.Collector = transport.CollectorConsumer{
		Durable: c.Collector.Consumer.Durable, AckWait: c.Collector.Consumer.AckWait.D(), MaxAckPending: c.Collector.Consumer.MaxAckPending,
	}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate checks every field and reports all problems at once.
func (c Config) Validate() error {
	var e units.Errors
	if !nameRE.MatchString(c.Node) {
		e.Add("node", fmt.Sprintf("%q: not usable in a NATS subject", c.Node), "use letters, digits, - and _ (e.g. the short hostname)")
	}
	if !nameRE.MatchString(c.Agent.ID) {
		e.Add("agent.id", fmt.Sprintf("%q: not usable in a message id", c.Agent.ID), "use letters, digits, - and _")
	} else if c.Agent.ID != c.Node && c.Collector.Consumer.AgentIDIsNode {
		// Caught here so `tapflow validate` with a new binary finds it
		// before an upgrade (docs/upgrade.md), not the DLQ after it.
		e.Add("agent.id", fmt.Sprintf("%q is not the node %q: collectors dead-letter its batches (collector.agent_id_is_node, on by default)", c.Agent.ID, c.Node),
			"remove agent.id (it defaults to the node), or set collector.agent_id_is_node: false here and on every collector (docs/upgrade.md)")
	}
	if c.DataDir == "" {
		e.Add("data_dir", "empty", "set a directory, e.g. /var/lib/tapflow")
	}
	switch c.Source {
	case "synthetic":
		e.Merge("synthetic", c.Synthetic.Validate())
	case "ebpf":
		e.Merge("capture", c.Capture.Validate())
		if c.Inventory.Provider == "file" && c.Inventory.File == "" {
			e.Add("inventory.file", "empty with source: ebpf", "point it at an inventory file (docs/inventory.md): real traffic needs OpenStack metadata")
		}
	default:
		e.Add("source", fmt.Sprintf("%q: unknown source", c.Source), "use synthetic or ebpf")
	}
	ec := c.EnrichConfig()
	if c.Source == "synthetic" && ec.Inventory.File == "" {
		// The synthetic cloud is the inventory; the other attribution
		// fields (poll interval, windows) still apply and are checked.
		ec.Inventory.File = "(synthetic)"
	}
	e.Merge("", prefixInventory(ec.Validate()))
	if c.Inventory.File != "" {
		if _, err := os.Stat(c.Inventory.File); err != nil {
			e.Add("inventory.file", err.Error(), "create the file or fix the path (docs/inventory.md)")
		}
	}
	if c.Agent.EdgeCapacity < 1 || c.Agent.EdgeCapacity > 4096 {
		e.Add("agent.edge_capacity", strconv.Itoa(c.Agent.EdgeCapacity)+": out of range", "use 1..4096 (default 16)")
	}
	if c.Agent.ShutdownTimeout.D() < time.Second {
		e.Add("agent.shutdown_timeout", c.Agent.ShutdownTimeout.String()+": too short", "use e.g. 30s")
	}
	e.Merge("agent.spool", c.Agent.Spool.Validate())
	e.Merge("nats", c.NATS.Validate())
	e.Merge("collector", c.Collector.Parquet.Validate())
	e.Merge("collector", c.Collector.Consumer.Validate(c.Collector.Parquet.RollAge.D()))
	c.validateOutput(&e)
	e.Merge("billing.flow_logs", c.Billing.FlowLogs.Validate())
	e.Merge("billing", c.Billing.Usage.Validate())
	e.Merge("", c.Billing.CloudKitty.Validate()) // its messages name billing.cloudkitty.*
	if c.Metrics.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Metrics.Listen); err != nil {
			e.Add("metrics.listen", fmt.Sprintf("%q: %v", c.Metrics.Listen, err), `use host:port, e.g. 127.0.0.1:9464, or "" to disable`)
		}
	}
	if !slices.Contains(LogFormats, c.Log.Format) {
		e.Add("log.format", fmt.Sprintf("%q: unknown", c.Log.Format), "use json or text")
	}
	if !slices.Contains(LogLevels, c.Log.Level) {
		e.Add("log.level", fmt.Sprintf("%q: unknown", c.Log.Level), "use debug, info, warn or error")
	}
	return e.Err()
}

// enrich.Config reports inventory fields as "inventory.x"; the rest are
// under attribution here.
func prefixInventory(err error) error {
	if err == nil {
		return nil
	}
	var out units.Errors
	for _, one := range unwrapAll(err) {
		var fe *units.FieldError
		if errors.As(one, &fe) && !strings.HasPrefix(fe.Path, "inventory.") {
			out.Add("attribution."+fe.Path, fe.Problem, fe.Fix)
			continue
		}
		out.Merge("", one)
	}
	return out.Err()
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// EnrichConfig assembles the enrich stage's config.
func (c Config) EnrichConfig() enrich.Config {
	return enrich.Config{
		Inventory:    c.Inventory,
		GhostGrace:   c.Attribution.GhostGrace,
		LateBinding:  c.Attribution.LateBinding,
		MaxRouteHops: c.Attribution.MaxRouteHops,
		SwapBarrier:  c.Attribution.SwapBarrier,
	}
}

// InventoryStatePath is the agent's local copy of the last inventory
// snapshot (provider nats), so a restart without NATS still attributes.
func (c Config) InventoryStatePath() string {
	return filepath.Join(c.AgentStateDir(), "inventory.snapshot")
}

// AgentStateDir is where the agent keeps its batch sequence.
func (c Config) AgentStateDir() string { return filepath.Join(c.DataDir, "agent") }

var yamlLineRE = regexp.MustCompile(`^line (\d+): (.*)$`)
var unknownFieldRE = regexp.MustCompile(`^field (\S+) not found in type`)
var seqIndexRE = regexp.MustCompile(`\[\d+\]$`)

// yamlErrors turns yaml.v3's errors ("line 7: cannot unmarshal ...") into
// FieldErrors with the dotted path of the key on that line.
func yamlErrors(data []byte, te *yaml.TypeError, hide func(int, string) string) error {
	paths := yamlpath.ByLine(data)
	var e units.Errors
	for _, msg := range te.Errors {
		m := yamlLineRE.FindStringSubmatch(msg)
		if m == nil {
			e.Add("(config)", msg, "")
			continue
		}
		line, _ := strconv.Atoi(m[1])
		path, problem := paths[line], hide(line, m[2])
		if path == "" {
			path = "line " + m[1]
		}
		if u := unknownFieldRE.FindStringSubmatch(problem); u != nil {
			e.Add(path, "unknown key "+u[1], "check the spelling; every key is listed in docs/config.md")
			continue
		}
		if strings.Contains(problem, "unmarshal !!seq") {
			// a flow sequence shares the key's line: name the key
			path = seqIndexRE.ReplaceAllString(path, "")
		}
		if strings.Contains(problem, "already defined at line") {
			e.Add(path, problem, "keep one of them; the other checks read the first")
			continue
		}
		if i := strings.LastIndex(problem, "; "); i > 0 {
			e.Add(path, problem[:i], problem[i+2:])
			continue
		}
		e.Add(path, problem, "see docs/config.md for the expected type")
	}
	return e.Err()
}
