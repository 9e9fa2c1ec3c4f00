package main

import (
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/top"
)

func init() { register(newTopCmd) }

func newTopCmd() *cobra.Command {
	var (
		metrics  string
		interval time.Duration
		once     bool
	)
	cmd := &cobra.Command{
		Use:   "top [--metrics URL[,URL…]] [--interval D] [--once]",
		Short: "per-stage records/s, queue depth, lag and errors of running tapflow processes, live",
		Long: `Per-stage records/s in and out, discards/s, errors, edge queue depth and lag
(age of the oldest unacked batch) of every pipeline stage of one or more
tapflow processes, read from their /metrics endpoints (metrics.listen) —
e.g. several agents and a collector — and redrawn every --interval, with
each endpoint's stream backlog, spool and loss figures below. Rates are the
counter increase between two scrapes. An endpoint that does not answer is
shown as DOWN; the others keep updating. Which metric is which column:
docs/operations.md (tapflow top).`,
		Example: `  tapflow top
  tapflow top --metrics http://cmp1:9464/metrics,http://cmp2:9464/metrics,http://collector1:9464/metrics
  tapflow top --once --interval 5s > snapshot.txt`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return usageErr("--interval %s is below 100ms; use e.g. 2s", interval)
			}
			var urls []string
			for _, u := range strings.Split(metrics, ",") {
				u = strings.TrimSpace(u)
				if u == "" {
					continue
				}
				if !strings.Contains(u, "://") {
					u = "http://" + u + "/metrics"
				}
				p, err := url.Parse(u)
				if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
					return usageErr("--metrics %q is not an http(s) URL; use e.g. http://127.0.0.1:9464/metrics", u)
				}
				urls = append(urls, u)
			}
			if len(urls) == 0 {
				return usageErr("--metrics is empty; name one or more /metrics URLs")
			}
			ctx, stop := signalContext()
			defer stop()
			return top.Run(ctx, cmd.OutOrStdout(), top.Options{URLs: urls, Interval: interval, Once: once, ANSI: !once})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&metrics, "metrics", "http://127.0.0.1:9464/metrics", "comma-separated /metrics `URLs` (a bare host:port means http://host:port/metrics)")
	fs.DurationVar(&interval, "interval", 2*time.Second, "time between scrapes: rates are over this")
	fs.BoolVar(&once, "once", false, "print one view (two scrapes --interval apart) without redrawing, then exit (for scripts)")
	return cmd
}
