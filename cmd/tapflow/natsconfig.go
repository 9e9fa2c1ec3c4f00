package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/transport/roles"
)

func init() { register(newNATSConfigCmd) }

const natsConfigLong = `Print a nats-server configuration for a fleet: one user per process, each
with exactly the permissions of its role (transport/roles, the lists the
embedded server applies and docs/security.md shows). Passwords are read by
nats-server from environment variables ($AGENT_CMP1_PASSWORD for user
agent-cmp1, …); replace them with bcrypt hashes if you prefer.

Consumer rights are granted by name only: a collector its durables
(--collector USER=DURABLE), a subscriber its durable (--subscriber
USER=DURABLE), an ordered subscriber its slots USER-0 … USER-(N-1)
(--ordered USER=N, default N 4: one per running tapflow tap). No user can
touch a consumer it does not own by name; two users owning one name are
refused.

Example (the configuration docs/security.md shows):
  tapflow nats-config --agent cmp1 --agent cmp2 --subscriber analytics=analytics --ordered tap`

func newNATSConfigCmd() *cobra.Command {
	ex := roles.Example()
	c := ex
	var agents, collectors, subscribers, ordered []string
	var inventoryUser, admin string
	cmd := &cobra.Command{
		Use:   "nats-config",
		Short: "print a nats-server configuration with every role's permissions",
		Long:  natsConfigLong,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			users, err := natsConfigUsers(agents, collectors, inventoryUser, subscribers, ordered, admin)
			if err != nil {
				return err
			}
			c.Users = users
			_, err = fmt.Fprint(cmd.OutOrStdout(), c.Render())
			return err
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&agents, "agent", nil, "a node with an agent (user agent-NODE); repeat per node")
	f.StringArrayVar(&collectors, "collector", []string{"collector"}, "a collector user, =DURABLE when its collector.durable is not tapflow-collector; repeatable")
	f.StringVar(&inventoryUser, "inventory", "inventory", "the user of tapflow inventory serve (\"\": none)")
	f.StringArrayVar(&subscribers, "subscriber", nil, "a subscriber user, =DURABLE for the durable it creates and reads; repeatable")
	f.StringArrayVar(&ordered, "ordered", nil, fmt.Sprintf("a subscriber user that creates ordered consumers (tapflow tap), =N for N at once (default %d); repeatable", roles.DefaultOrderedSlots))
	f.StringVar(&admin, "admin", "ops", "the operators' user (\"\": none)")
	f.StringVar(&c.Listen, "listen", ex.Listen, "nats-server's listen address")
	f.StringVar(&c.CertFile, "cert-file", ex.CertFile, "server certificate (\"\": no TLS)")
	f.StringVar(&c.KeyFile, "key-file", ex.KeyFile, "server key")
	f.StringVar(&c.CAFile, "ca-file", ex.CAFile, "CA clients' certificates must chain to (\"\": no client certificates)")
	f.StringVar(&c.StoreDir, "store-dir", ex.StoreDir, "JetStream store directory")
	return cmd
}

var natsName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// natsConfigUsers builds the user list in the order the docs show it.
func natsConfigUsers(agents, collectors []string, inventoryUser string, subscribers, ordered []string, admin string) ([]roles.User, error) {
	var users []roles.User
	seen := map[string]bool{}
	add := func(flag string, u roles.User) error {
		for _, n := range []string{u.Node, u.Durable, u.Name} {
			if n != "" && !natsName.MatchString(n) {
				return usageErr("--%s: %q is not a usable NATS name (1-64 letters, digits, - and _)", flag, n)
			}
		}
		if seen[u.Name] {
			return usageErr("--%s: user %q given twice", flag, u.Name)
		}
		seen[u.Name] = true
		users = append(users, u)
		return nil
	}
	if len(agents) == 0 {
		return nil, usageErr("no --agent: give each node with an agent")
	}
	for _, n := range agents {
		if err := add("agent", roles.User{Name: "agent-" + n, Role: roles.Agent, Node: n}); err != nil {
			return nil, err
		}
	}
	for _, c := range collectors {
		name, durable, _ := strings.Cut(c, "=")
		if err := add("collector", roles.User{Name: name, Role: roles.Collector, Durable: durable}); err != nil {
			return nil, err
		}
	}
	if inventoryUser != "" {
		if err := add("inventory", roles.User{Name: inventoryUser, Role: roles.Inventory}); err != nil {
			return nil, err
		}
	}
	for _, s := range subscribers {
		name, durable, _ := strings.Cut(s, "=")
		if err := add("subscriber", roles.User{Name: name, Role: roles.Subscriber, Durable: durable}); err != nil {
			return nil, err
		}
	}
	for _, o := range ordered {
		name, n, _ := strings.Cut(o, "=")
		slots := 0
		if n != "" {
			var err error
			if slots, err = strconv.Atoi(n); err != nil || slots < 1 || slots > roles.MaxOrderedSlots {
				return nil, usageErr("--ordered %s: %q is not a slot count; use 1..%d", o, n, roles.MaxOrderedSlots)
			}
		}
		if err := add("ordered", roles.User{Name: name, Role: roles.Subscriber, Ordered: true, Slots: slots}); err != nil {
			return nil, err
		}
	}
	if admin != "" {
		if err := add("admin", roles.User{Name: admin, Role: roles.Admin}); err != nil {
			return nil, err
		}
	}
	if cf := roles.Conflicts(users); len(cf) > 0 {
		return nil, usageErr("user %s: %s; give each user consumer names of its own (rename the durable or the user: ordered slots are USER-0, USER-1, …)", users[cf[0].User].Name, cf[0].Problem)
	}
	return users, nil
}
