package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/config"
)

func init() { register(newValidateCmd) }

func newValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "check a config file and list every problem",
		Long: `Check a config file without running anything. Lists every bad field with its
path and the fix; exit code 2 when there is any.`,
		Args: exactArgs(1, "one config file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := config.Load(args[0]); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: invalid:\n%s\n", args[0], indent(err))
				return exitCode(exitUsage)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", args[0])
			return nil
		},
	}
}
