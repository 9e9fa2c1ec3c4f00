// Package cloudkitty is tapflow's client of CloudKitty, OpenStack's rating
// service (v2 API, CloudKitty 17 on Debian 12): it schedules the reprocess
// of an hour whose totals changed after CloudKitty rated it (POST
// /v2/task/reprocesses) and reads what CloudKitty rated (GET /v2/summary,
// GET /v2/scope) for operators and tests.
//
// tapflow does not write into CloudKitty: CloudKitty's own processor reads
// tapflow_billed_bytes from Prometheus (deploy/cloudkitty/metrics.yml) and
// prices it with its hashmap. docs/billing.md describes the chain.
//
// Keystone auth goes through gophercloud (enrich/provider/openstack's
// Session: the same credential sources and errors as the inventory); the
// rating endpoint comes from the catalog (type "rating") unless configured.
package cloudkitty

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
)

// Client talks to one CloudKitty. Safe for concurrent use.
type Client struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu sync.Mutex
	sc *gophercloud.ServiceClient // nil until the first call authenticates
}

// New validates cfg and returns a client; nothing is contacted until the
// first call. Its metrics are in Collectors (the caller registers them).
func New(cfg Config, log *slog.Logger) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultConfig().Timeout
	}
	if log == nil {
		log = slog.Default()
	}
	return &Client{cfg: cfg, log: log.With("component", "billing", "sink", "cloudkitty"), m: newMetrics()}, nil
}

// Collectors are the client's metrics, every series at 0 from the start.
func (c *Client) Collectors() []prometheus.Collector { return []prometheus.Collector{c.m.reprocess} }

// Close releases nothing yet; it is here so the client fits the
// constructor/Close convention of tapflow's components.
func (c *Client) Close() error { return nil }

// service authenticates once and finds the rating endpoint.
func (c *Client) service(ctx context.Context) (*gophercloud.ServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sc != nil {
		return c.sc, nil
	}
	pc, eo, err := openstack.Session(ctx, c.cfg.auth())
	if err != nil {
		return nil, fmt.Errorf("cloudkitty: %w", err)
	}
	endpoint := c.cfg.Endpoint
	if endpoint == "" {
		eo.ApplyDefaults("rating")
		if endpoint, err = pc.EndpointLocator(eo); err != nil {
			return nil, fmt.Errorf("cloudkitty: the Keystone catalog has no rating endpoint on interface %s: %w; register CloudKitty (type rating) or set billing.cloudkitty.endpoint", eo.Availability, err)
		}
	}
	c.sc = &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(endpoint), Type: "rating"}
	return c.sc, nil
}

// APIError is CloudKitty's refusal of a request: the method, path, HTTP
// status and CloudKitty's own message (never the token).
type APIError struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("cloudkitty %s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Message)
}

// call runs one request.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body, out any, ok ...int) error {
	sc, err := c.service(ctx)
	if err != nil {
		return err
	}
	u := sc.ServiceURL(strings.Split(strings.TrimPrefix(path, "/"), "/")...)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	opts := &gophercloud.RequestOpts{JSONBody: body, OkCodes: ok}
	if out != nil {
		opts.JSONResponse = out
	}
	if _, err := sc.Request(ctx, method, u, opts); err != nil {
		var rc gophercloud.ErrUnexpectedResponseCode
		var rcp *gophercloud.ErrUnexpectedResponseCode
		switch {
		case errors.As(err, &rc):
			return &APIError{method, path, rc.Actual, short(rc.Body)}
		case errors.As(err, &rcp):
			return &APIError{method, path, rcp.Actual, short(rcp.Body)}
		}
		return fmt.Errorf("cloudkitty %s %s: %w", method, path, err)
	}
	return nil
}

func short(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// Scope is a CloudKitty rating scope (a project) and how far it is rated.
type Scope struct {
	ID        string `json:"scope_id"`
	ScopeKey  string `json:"scope_key"`
	Fetcher   string `json:"fetcher"`
	Collector string `json:"collector"`
	Active    bool   `json:"active"`
	// LastProcessed is the start of the last period CloudKitty rated;
	// zero when it rated none.
	LastProcessed time.Time `json:"-"`
	RawLast       string    `json:"last_processed_timestamp"`
}

// Scopes returns the state of the given scopes (all when ids is empty).
// A project CloudKitty has never rated is absent.
func (c *Client) Scopes(ctx context.Context, ids []string) ([]Scope, error) {
	var all []Scope
	for offset := 0; ; {
		q := url.Values{"offset": {strconv.Itoa(offset)}, "limit": {"100"}}
		if len(ids) > 0 {
			q.Set("scope_id", strings.Join(ids, ","))
		}
		var page struct {
			Results []Scope `json:"results"`
		}
		if err := c.call(ctx, "GET", "v2/scope", q, nil, &page, 200); err != nil {
			var ae *APIError
			if errors.As(err, &ae) && ae.Status == 404 { // CloudKitty's answer when no scope matches
				return all, nil
			}
			return nil, err
		}
		for _, s := range page.Results {
			if s.RawLast != "" {
				t, err := parseTime(s.RawLast)
				if err != nil {
					return nil, fmt.Errorf("cloudkitty GET v2/scope: scope %s: last_processed_timestamp %q: %w", s.ID, s.RawLast, err)
				}
				s.LastProcessed = t
			}
			all = append(all, s)
		}
		if len(page.Results) < 100 {
			return all, nil
		}
		offset += len(page.Results)
	}
}

func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, errors.New("not an ISO 8601 time")
}

// Reprocess schedules CloudKitty to delete and rate again the periods
// starting in [start, end] (both period starts, end included, as
// CloudKitty counts them) for the scopes. CloudKitty refuses scopes it has
// not rated up to end, and a schedule overlapping a pending one.
func (c *Client) Reprocess(ctx context.Context, scopes []string, start, end time.Time, reason string) error {
	if len(scopes) == 0 {
		return errors.New("cloudkitty reprocess: no scope given")
	}
	if strings.TrimSpace(reason) == "" {
		return errors.New("cloudkitty reprocess: CloudKitty requires a reason")
	}
	body := map[string]any{
		"scope_ids":            strings.Join(scopes, ","),
		"start_reprocess_time": start.UTC().Format(time.RFC3339),
		"end_reprocess_time":   end.UTC().Format(time.RFC3339),
		"reason":               reason,
	}
	return c.call(ctx, "POST", "v2/task/reprocesses", nil, body, nil, 202)
}

// pending returns the scopes with a reprocess schedule that will still
// rate hour: it covers the hour and has not passed it. CloudKitty refuses
// an overlapping schedule, and the pending one reads Prometheus' current
// sum when it gets there. The newest 100 schedules of the scopes are
// read (CloudKitty lists them newest first; pending ones are the newest).
func (c *Client) pending(ctx context.Context, scopes []string, hour time.Time) (map[string]bool, error) {
	var page struct {
		Results []struct {
			Scope   string `json:"scope_id"`
			Start   string `json:"start_reprocess_time"`
			End     string `json:"end_reprocess_time"`
			Current string `json:"current_reprocess_time"`
		} `json:"results"`
	}
	q := url.Values{"scope_ids": {strings.Join(scopes, ",")}, "limit": {"100"}}
	if err := c.call(ctx, "GET", "v2/task/reprocesses", q, nil, &page, 200); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range page.Results {
		start, err1 := parseTime(r.Start)
		end, err2 := parseTime(r.End)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("cloudkitty GET v2/task/reprocesses: scope %s: %w", r.Scope, err)
		}
		if hour.Before(start) || hour.After(end) {
			continue
		}
		if r.Current != "" {
			cur, err := parseTime(r.Current)
			if err != nil {
				return nil, fmt.Errorf("cloudkitty GET v2/task/reprocesses: scope %s: %w", r.Scope, err)
			}
			if !cur.Before(hour) {
				continue // it has rated the hour already
			}
		}
		out[r.Scope] = true
	}
	return out, nil
}

// Corrected is the usage stage's correction hook (billing/usage's
// Corrector): hour's totals changed for projects after they were
// published. For each project CloudKitty already rated the hour of, it
// schedules a reprocess of exactly that hour (CloudKitty deletes its
// rating and reads Prometheus again, which now sums the corrections); a
// project not rated that far yet needs nothing, CloudKitty will read the
// corrected total when it gets there. Reprocessing happens on the
// processor's next pass (CloudKitty sleeps one period between passes).
func (c *Client) Corrected(ctx context.Context, hour time.Time, projects []string) error {
	hour = hour.UTC().Truncate(time.Hour)
	if len(projects) == 0 {
		return nil
	}
	scopes, err := c.Scopes(ctx, projects)
	if err != nil {
		c.m.reprocess.WithLabelValues("failed").Add(float64(len(projects)))
		return fmt.Errorf("reprocess hour %s: %w", hour.Format("2006-01-02T15"), err)
	}
	var rated []string
	for _, s := range scopes {
		if slices.Contains(projects, s.ID) && !s.LastProcessed.IsZero() && !s.LastProcessed.Before(hour) {
			rated = append(rated, s.ID)
		}
	}
	slices.Sort(rated)
	rated = slices.Compact(rated)
	if n := len(projects) - len(rated); n > 0 {
		c.m.reprocess.WithLabelValues("not_rated_yet").Add(float64(n))
	}
	if len(rated) == 0 {
		c.log.Info("correction: CloudKitty has not rated the hour yet; nothing to reprocess", "hour", hour, "projects", len(projects))
		return nil
	}
	pend, err := c.pending(ctx, rated, hour)
	if err != nil {
		c.m.reprocess.WithLabelValues("failed").Add(float64(len(rated)))
		return fmt.Errorf("reprocess hour %s: %w", hour.Format("2006-01-02T15"), err)
	}
	rated = slices.DeleteFunc(rated, func(id string) bool { return pend[id] })
	if len(pend) > 0 {
		c.m.reprocess.WithLabelValues("already_scheduled").Add(float64(len(pend)))
		c.log.Info("correction: a pending CloudKitty reprocess covers the hour already", "hour", hour, "projects", len(pend))
	}
	if len(rated) == 0 {
		return nil
	}
	reason := fmt.Sprintf("tapflow correction of %s (late records changed the published totals)", hour.Format("2006-01-02T15:04Z"))
	if err := c.Reprocess(ctx, rated, hour, hour, reason); err != nil {
		c.m.reprocess.WithLabelValues("failed").Add(float64(len(rated)))
		return fmt.Errorf("reprocess hour %s: %w", hour.Format("2006-01-02T15"), err)
	}
	c.m.reprocess.WithLabelValues("scheduled").Add(float64(len(rated)))
	c.log.Info("correction: CloudKitty reprocess scheduled", "hour", hour, "projects", rated)
	return nil
}

// SummaryQuery selects GET /v2/summary's rows.
type SummaryQuery struct {
	Begin, End time.Time
	// GroupBy are CloudKitty group-by keys: type, project_id, and the
	// groupby labels of metrics.yml (zone, direction, external_network,
	// lb_id).
	GroupBy []string
	// Filters restrict rows, e.g. {"type": {"billed_bytes",
	// "billed_bytes_e9"}, "project_id": {"..."}}.
	Filters map[string][]string
}

// SummaryRow is one row: its group-by values, the rated quantity and the
// price as CloudKitty returns them (floats: InfluxDB stores both as float64).
type SummaryRow struct {
	Groups map[string]string
	Qty    float64
	Rate   float64
}

// Summary reads GET /v2/summary (object format), every page.
func (c *Client) Summary(ctx context.Context, sq SummaryQuery) ([]SummaryRow, error) {
	var rows []SummaryRow
	for offset := 0; ; {
		q := url.Values{"response_format": {"object"}, "offset": {strconv.Itoa(offset)}, "limit": {"100"}}
		if !sq.Begin.IsZero() {
			q.Set("begin", sq.Begin.UTC().Format(time.RFC3339))
		}
		if !sq.End.IsZero() {
			q.Set("end", sq.End.UTC().Format(time.RFC3339))
		}
		if len(sq.GroupBy) > 0 {
			q.Set("groupby", strings.Join(sq.GroupBy, ","))
		}
		for k, vs := range sq.Filters {
			for _, v := range vs {
				q.Add("filters", k+":"+v)
			}
		}
		var page struct {
			Results []map[string]any `json:"results"`
		}
		if err := c.call(ctx, "GET", "v2/summary", q, nil, &page, 200); err != nil {
			return nil, err
		}
		for _, r := range page.Results {
			row := SummaryRow{Groups: map[string]string{}}
			var err error
			if row.Qty, err = number(r["qty"]); err != nil {
				return nil, fmt.Errorf("cloudkitty GET v2/summary: qty: %w", err)
			}
			if row.Rate, err = number(r["rate"]); err != nil {
				return nil, fmt.Errorf("cloudkitty GET v2/summary: rate: %w", err)
			}
			for _, g := range sq.GroupBy {
				if v, ok := r[g].(string); ok {
					row.Groups[g] = v
				}
			}
			rows = append(rows, row)
		}
		if len(page.Results) < 100 {
			return rows, nil
		}
		offset += len(page.Results)
	}
}

// number reads a JSON number as gophercloud decodes it (json.Number, or
// float64); null is 0 (CloudKitty's rate of an unpriced row).
func number(v any) (float64, error) {
	switch n := v.(type) {
	case nil:
		return 0, nil
	case float64:
		return n, nil
	case json.Number:
		return n.Float64()
	}
	return 0, fmt.Errorf("%v (%T) is not a number", v, v)
}

type metrics struct {
	reprocess *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{reprocess: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tapflow_billing_cloudkitty_reprocess_projects_total",
		Help: "Projects of corrected hours by what the CloudKitty hook did: scheduled (POST /v2/task/reprocesses accepted), already_scheduled (a pending reprocess covers the hour), not_rated_yet (CloudKitty had not rated the hour: it reads the corrected total itself), failed (the bill keeps the old total until retried).",
	}, []string{"result"})}
	for _, r := range []string{"scheduled", "already_scheduled", "not_rated_yet", "failed"} {
		m.reprocess.WithLabelValues(r)
	}
	return m
}
