// Command tapflow is the flow-log pipeline for OpenStack clouds: per-tenant,
// byte-exact traffic records from VM taps to Parquet. See `tapflow help`.
//
// Each command lives in its own file and registers itself in init():
//
//	func init() { register(newFooCmd) }
//
// so adding a command is one file (the constructor, its flags and RunE).
// cli.go holds what they share: exit codes, usage errors, the --config
// family of flags and the NATS target.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/version"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2 // bad flags, arguments or config
)

const rootLong = `tapflow — per-tenant, byte-exact flow records for OpenStack clouds

Docs: docs/config.md (every config key), docs/operations.md (metrics, signals).`

// constructors of the top-level commands, filled by register in init().
var commands []func() *cobra.Command

// register adds a top-level command; call it from an init() in the
// command's own file.
func register(newCmd func() *cobra.Command) { commands = append(commands, newCmd) }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run executes the command line args and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// cobra's own errors: unknown command, bad arguments.
		ee = &exitError{code: exitUsage, err: err}
	}
	if ee.err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), ee.err)
		if ee.code == exitUsage && ee.hint {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
	}
	return ee.code
}

// newRoot builds the command tree: a new one per run, so flag values never
// leak from one run (or test) to the next.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:     "tapflow <command>",
		Short:   "per-tenant, byte-exact flow records for OpenStack clouds",
		Long:    rootLong,
		Version: version.Version,
		// tapflow alone: the help, on stderr, and exit 2. (An unknown
		// command is cobra's error, with suggestions.)
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Help()
			return &exitError{code: exitUsage}
		},
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetVersionTemplate("tapflow {{.Version}}\n")
	root.SetUsageTemplate(usageTemplate)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		msg := err.Error()
		// Go's flag package accepted -config; pflag reads it as -c -o …
		if strings.HasPrefix(msg, "unknown shorthand flag") {
			msg += " (long flags take two dashes, e.g. --config)"
		}
		return &exitError{code: exitUsage, err: errors.New(msg), hint: true}
	})
	for _, newCmd := range commands {
		root.AddCommand(newCmd())
	}
	wrapRunE(root)
	return root
}

// wrapRunE makes every error a command returns an exitError: plain errors
// are runtime failures (exit 1); usage errors are built with usageErr.
func wrapRunE(c *cobra.Command) {
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := f(cmd, args)
			var ee *exitError
			if err != nil && !errors.As(err, &ee) {
				return &exitError{code: exitRuntime, err: err}
			}
			return err
		}
	}
	for _, sub := range c.Commands() {
		wrapRunE(sub)
	}
}

// usageTemplate is cobra's, with "Commands:" and tapflow's hint line.
const usageTemplate = `Usage:
  {{.UseLine}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasAvailableSubCommands}}

Commands:{{range .Commands}}{{if .IsAvailableCommand}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Flags of {{.Parent.CommandPath}}:
{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableSubCommands}}

Run '{{.CommandPath}} <command> --help' for the flags of a command.{{end}}
`
