package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tapflow/tapflow/internal/top"
)

const topUsage = `Usage: tapflow top [--metrics URL[,URL…]] [--interval D] [--once]

Per-stage records/s in and out, discards/s, errors, edge queue depth and lag
(age of the oldest unacked batch) of every pipeline stage of one or more
tapflow processes, read from their /metrics endpoints (metrics.listen) —
e.g. several agents and a collector — and redrawn every --interval, with
each endpoint's stream backlog, spool and loss figures below. Rates are the
counter increase between two scrapes. An endpoint that does not answer is
shown as DOWN; the others keep updating. Which metric is which column:
docs/operations.md (tapflow top).

Examples:
  tapflow top
  tapflow top --metrics http://cmp1:9464/metrics,http://cmp2:9464/metrics,http://collector1:9464/metrics
  tapflow top --once --interval 5s > snapshot.txt

Flags:
`

// topCmd implements `tapflow top` (internal/top).
func topCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	metrics := fs.String("metrics", "http://127.0.0.1:9464/metrics", "comma-separated /metrics URLs (a bare host:port means http://host:port/metrics)")
	interval := fs.Duration("interval", 2*time.Second, "time between scrapes: rates are over this")
	once := fs.Bool("once", false, "print one view (two scrapes --interval apart) without redrawing, then exit (for scripts)")
	fs.Usage = func() { fmt.Fprint(stderr, topUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tapflow top: unexpected argument %q; flags only (see tapflow top --help)\n", fs.Arg(0))
		return exitUsage
	}
	if *interval < 100*time.Millisecond {
		fmt.Fprintf(stderr, "tapflow top: --interval %s is below 100ms; use e.g. 2s\n", *interval)
		return exitUsage
	}
	var urls []string
	for _, u := range strings.Split(*metrics, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.Contains(u, "://") {
			u = "http://" + u + "/metrics"
		}
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			fmt.Fprintf(stderr, "tapflow top: --metrics %q is not an http(s) URL; use e.g. http://127.0.0.1:9464/metrics\n", u)
			return exitUsage
		}
		urls = append(urls, u)
	}
	if len(urls) == 0 {
		fmt.Fprintln(stderr, "tapflow top: --metrics is empty; name one or more /metrics URLs")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := top.Run(ctx, stdout, top.Options{URLs: urls, Interval: *interval, Once: *once, ANSI: !*once}); err != nil {
		fmt.Fprintf(stderr, "tapflow top: %v\n", err)
		return exitRuntime
	}
	return exitOK
}
