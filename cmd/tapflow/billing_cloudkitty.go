package main

import (
	"github.com/tapflow/tapflow/billing/cloudkitty"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
)

// With billing.cloudkitty.enabled, a correction of a published hour (or an
// hour first published after CloudKitty rated it) schedules CloudKitty's
// reprocess of that hour for the projects it changed (docs/billing.md).
func init() {
	billingCorrector = func(cfg config.Config) (usage.Corrector, error) {
		if !cfg.Billing.CloudKitty.Enabled {
			return nil, nil
		}
		return cloudkitty.New(cfg.Billing.CloudKitty, nil)
	}
}
