package top

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Render writes v as a table: one row per endpoint, pipeline and stage,
// then the endpoint-wide figures and the endpoints that failed.
func Render(w io.Writer, v View) error {
	fmt.Fprintf(w, "tapflow top  %s  rates over %s\n\n", v.At.UTC().Format("2006-01-02 15:04:05Z"), v.Interval.Round(10*time.Millisecond))
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ENDPOINT\tPIPELINE\tSTAGE\tIN/s\tOUT/s\tDROP/s\tERRORS\tERR/s\tQUEUE\tLAG\t")
	for _, r := range v.Rows {
		lag := "-"
		if !math.IsNaN(r.Lag) {
			lag = fmt.Sprintf("%.1fs", r.Lag)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%.0f\t%s\t\n", short(r.Endpoint), r.Pipeline, r.Stage,
			rate(r.In), rate(r.Out), rate(r.Drop), r.Errors, rate(r.ErrRate), r.Queue, lag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Extras) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		last := ""
		var line []string
		flush := func() { // items on lines of at most ~100 columns
			name := short(last)
			for len(line) > 0 {
				n, width := 0, 0
				for n < len(line) && (n == 0 || width+len(line[n]) < 100) {
					width += len(line[n]) + 2
					n++
				}
				fmt.Fprintf(tw, "%s\t%s\n", name, strings.Join(line[:n], "  "))
				line, name = line[n:], ""
			}
		}
		for _, e := range v.Extras {
			if e.Endpoint != last {
				flush()
				last = e.Endpoint
			}
			line = append(line, e.Name+" "+e.Value)
		}
		flush()
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, e := range v.Errors {
		fmt.Fprintln(w, "DOWN", e)
	}
	return nil
}

func rate(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e4:
		return fmt.Sprintf("%.1fk", x/1e3)
	case x >= 10 || x == 0:
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// short is host:port of an endpoint URL.
func short(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Host
	}
	return u
}

// Options configure Run.
type Options struct {
	URLs     []string
	Interval time.Duration
	// Once prints one view (rates over one Interval) and returns.
	Once bool
	// ANSI redraws the screen in place (clear, home) before each view.
	ANSI   bool
	Client *http.Client
}

// Run scrapes every URL every Interval and draws the view until ctx ends
// (or once).
func Run(ctx context.Context, w io.Writer, o Options) error {
	c := o.Client
	if c == nil {
		c = &http.Client{Timeout: max(o.Interval, time.Second)}
	}
	prev := scrapeAll(ctx, c, o.URLs)
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur := scrapeAll(ctx, c, o.URLs)
		var b strings.Builder
		if o.ANSI {
			b.WriteString("\x1b[H\x1b[2J")
		}
		if err := Render(&b, Compute(prev, cur)); err != nil {
			return err
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
		if o.Once {
			return nil
		}
		prev = cur
	}
}

// scrapeAll scrapes the endpoints in parallel.
func scrapeAll(ctx context.Context, c *http.Client, urls []string) []*Sample {
	out := make([]*Sample, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() { out[i] = Scrape(ctx, c, u) })
	}
	wg.Wait()
	return out
}
