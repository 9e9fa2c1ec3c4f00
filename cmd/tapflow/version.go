package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/version"
)

func init() { register(newVersionCmd) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Long:  "Print the version of this binary (also: tapflow --version).",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "tapflow", version.Version)
			return err
		},
	}
}
