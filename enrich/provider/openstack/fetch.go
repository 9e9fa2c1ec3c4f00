package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
)

// FetchError is a failed API call or an unusable response. Endpoint is the
// collection (the metric label: keystone, projects, networks, subnets,
// ports, routers, floatingips, servers, loadbalancers, amphorae, pools,
// members); Code is the HTTP status, or network, timeout, decode, catalog
// or config.
type FetchError struct {
	Endpoint string
	Code     string
	URL      string // request URL (no credentials), may be empty
	Err      error
	Fix      string
}

func (e *FetchError) Error() string {
	var b strings.Builder
	b.WriteString("openstack ")
	b.WriteString(e.Endpoint)
	if e.URL != "" {
		b.WriteString(": GET ")
		b.WriteString(e.URL)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if e.Fix != "" {
		b.WriteString("; ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

func (e *FetchError) Unwrap() error { return e.Err }

// redacted replaces every secret in s.
func (p *Provider) redact(s string) string {
	for _, sec := range p.creds.secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "[REDACTED]")
		}
	}
	return s
}

// scrub returns err with every secret removed from its text (keeping the
// FetchError structure for errors.As).
func (p *Provider) scrub(err error) error {
	if err == nil {
		return nil
	}
	var fe *FetchError
	if errors.As(err, &fe) {
		c := *fe
		c.Err = errors.New(p.redact(fe.Err.Error()))
		c.URL = p.redact(fe.URL)
		return &c
	}
	return errors.New(p.redact(err.Error()))
}

// classify turns a gophercloud/HTTP error into a FetchError with a code and
// a fix naming the service.
func (p *Provider) classify(endpoint, service, u string, err error) *FetchError {
	fe := &FetchError{Endpoint: endpoint, URL: u, Err: err}
	var rc gophercloud.ErrUnexpectedResponseCode
	var rcp *gophercloud.ErrUnexpectedResponseCode
	status := 0
	var body []byte
	switch {
	case errors.As(err, &rc):
		status, body = rc.Actual, rc.Body
	case errors.As(err, &rcp):
		status, body = rcp.Actual, rcp.Body
	}
	if status != 0 {
		fe.Code = strconv.Itoa(status)
		msg := strings.TrimSpace(string(body))
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		fe.Err = fmt.Errorf("HTTP %d: %s", status, msg)
		switch {
		case status == http.StatusUnauthorized:
			fe.Fix = "the credentials were refused: check the clouds.yaml entry or OS_* variables (a token cannot be renewed; prefer an application credential)"
		case status == http.StatusForbidden:
			fe.Fix = fmt.Sprintf("the user lacks the right to list %s: it needs the admin (or system reader) role", endpoint)
		case status == http.StatusNotFound:
			fe.Fix = fmt.Sprintf("%s has no such URL: check the %s endpoint in the catalog (or noauth config) and its version path", service, service)
		case status >= 500:
			fe.Fix = fmt.Sprintf("%s failed; see its log", service)
		default:
			fe.Fix = fmt.Sprintf("%s refused the request", service)
		}
		return fe
	}
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		fe.Code = "timeout"
		fe.Fix = fmt.Sprintf("%s did not answer within inventory.openstack.timeout (%s); check its health and load", service, p.cfg.Timeout)
	case errors.Is(err, context.Canceled):
		fe.Code = "canceled"
	case errors.As(err, &ue) || errors.As(err, &ne):
		fe.Code = "network"
		fe.Fix = fmt.Sprintf("cannot reach %s: check that it runs and that the %s endpoint (interface %s) is reachable from this host", service, service, p.ifaceName())
	case endpoint == "keystone":
		fe.Code = "config"
		fe.Fix = "the credentials are incomplete or contradictory: check the clouds.yaml entry or OS_* variables"
	default:
		fe.Code = "other"
		fe.Fix = fmt.Sprintf("unexpected failure talking to %s", service)
	}
	return fe
}

func (p *Provider) ifaceName() string {
	if p.cfg.NoAuth != nil {
		return "noauth"
	}
	return p.cfg.Interface
}

// collection describes one list call.
type collection struct {
	endpoint string // metric label and error prefix
	service  string // Neutron, Nova, Octavia, Keystone
	path     string // relative to the client's resource base
	key      string // the list's key in the response
	fields   []string
	paged    bool // send limit= (the API paginates)
	// required keys of every object; "a|b" means either.
	required []string
	// nullable keys may be null; others in required must be non-null
	// (objects only, strings, lists).
	nullable []string
	query    url.Values
}

const maxBody = 512 << 20

// list reads every page of c into []T, checking that every object has the
// required fields.
func list[T any](ctx context.Context, p *Provider, sc *gophercloud.ServiceClient, c collection) ([]T, error) {
	q := url.Values{}
	for k, v := range c.query {
		q[k] = v
	}
	for _, f := range c.fields {
		q.Add("fields", f)
	}
	if c.paged {
		q.Set("limit", strconv.Itoa(p.cfg.PageSize))
	}
	u := sc.ServiceURL(c.path)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	base, err := url.Parse(u)
	if err != nil {
		return nil, &FetchError{Endpoint: c.endpoint, Code: "config", URL: u, Err: err, Fix: "check the endpoint URL"}
	}
	var out []T
	seen := map[string]bool{}
	for page := 0; u != ""; page++ {
		if page > 100000 {
			return nil, &FetchError{Endpoint: c.endpoint, Code: "decode", URL: u, Err: errors.New("more than 100000 pages"),
				Fix: c.service + " keeps returning next links; check its pagination"}
		}
		if seen[u] {
			return nil, &FetchError{Endpoint: c.endpoint, Code: "decode", URL: u, Err: errors.New("the next link repeats an earlier page"),
				Fix: c.service + "'s pagination loops; check the API server"}
		}
		seen[u] = true
		items, next, err := getPage[T](ctx, p, sc, c, u)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" || len(items) == 0 {
			break
		}
		u, err = followLink(base, next, c.fields)
		if err != nil {
			return nil, &FetchError{Endpoint: c.endpoint, Code: "decode", URL: u, Err: fmt.Errorf("next link %q: %w", next, err),
				Fix: c.service + " returned an unusable next link"}
		}
	}
	return out, nil
}

// followLink rebases next onto the scheme and host the first request
// used (a proxy may rewrite them) and re-adds fields= when the API drops it
// from its links (Octavia does).
func followLink(base *url.URL, next string, fields []string) (string, error) {
	n, err := url.Parse(next)
	if err != nil {
		return "", err
	}
	n = base.ResolveReference(n)
	n.Scheme, n.Host, n.User = base.Scheme, base.Host, nil
	if len(fields) > 0 {
		q := n.Query()
		if _, ok := q["fields"]; !ok {
			for _, f := range fields {
				q.Add("fields", f)
			}
			n.RawQuery = q.Encode()
		}
	}
	return n.String(), nil
}

func getPage[T any](ctx context.Context, p *Provider, sc *gophercloud.ServiceClient, c collection, u string) ([]T, string, error) {
	resp, err := sc.Get(ctx, u, nil, &gophercloud.RequestOpts{KeepResponseBody: true, OkCodes: []int{200}})
	if err != nil {
		return nil, "", p.classify(c.endpoint, c.service, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, "", p.classify(c.endpoint, c.service, u, err)
	}
	bad := func(format string, args ...any) error {
		return &FetchError{Endpoint: c.endpoint, Code: "decode", URL: u, Err: fmt.Errorf(format, args...),
			Fix: fmt.Sprintf("this is not %s's API answer as attribution needs it: check the endpoint URL, the API version and any proxy in between", c.service)}
	}
	if len(body) > maxBody {
		return nil, "", bad("response larger than %d MiB", maxBody>>20)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, "", bad("invalid JSON (%s): %s", describeJSONError(err), snippet(body))
	}
	raw, ok := top[c.key]
	if !ok {
		keys := make([]string, 0, len(top))
		for k := range top {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, "", bad("the response has no %q list (keys: %s)", c.key, strings.Join(keys, ", "))
	}
	var objs []json.RawMessage
	if err := json.Unmarshal(raw, &objs); err != nil {
		return nil, "", bad("%q is not a list of objects: %s", c.key, describeJSONError(err))
	}
	items := make([]T, len(objs))
	for i, o := range objs {
		if err := checkObject(o, c); err != nil {
			return nil, "", bad("%s[%d]%s: %v", c.key, i, idOf(o), err)
		}
		if err := json.Unmarshal(o, &items[i]); err != nil {
			return nil, "", bad("%s[%d]%s: %s", c.key, i, idOf(o), describeJSONError(err))
		}
	}
	next, err := nextLink(top, c.key)
	if err != nil {
		return nil, "", bad("%v", err)
	}
	return items, next, nil
}

// checkObject verifies the required keys are present (and non-null unless
// nullable).
func checkObject(o json.RawMessage, c collection) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(o, &m); err != nil {
		return fmt.Errorf("not an object: %s", describeJSONError(err))
	}
	var missing []string
	for _, req := range c.required {
		found := false
		for _, alt := range strings.Split(req, "|") {
			v, ok := m[alt]
			if ok && (string(v) != "null" || slices.Contains(c.nullable, alt)) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, strings.ReplaceAll(req, "|", " or "))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing field %s", strings.Join(missing, ", "))
	}
	return nil
}

func idOf(o json.RawMessage) string {
	var v struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(o, &v) == nil && v.ID != nil {
		return fmt.Sprintf(" (id %v)", v.ID)
	}
	return ""
}

// nextLink reads "<key>_links": [{rel: next, href}] (Neutron, Nova,
// Octavia) or "links": {"next": url} (Keystone).
func nextLink(top map[string]json.RawMessage, key string) (string, error) {
	if raw, ok := top[key+"_links"]; ok && string(raw) != "null" {
		var links []struct {
			Rel  string `json:"rel"`
			Href string `json:"href"`
		}
		if err := json.Unmarshal(raw, &links); err != nil {
			return "", fmt.Errorf("%s_links: %s", key, describeJSONError(err))
		}
		for _, l := range links {
			if l.Rel == "next" {
				return l.Href, nil
			}
		}
		return "", nil
	}
	if raw, ok := top["links"]; ok && len(raw) > 0 && raw[0] == '{' {
		var links struct {
			Next *string `json:"next"`
		}
		if err := json.Unmarshal(raw, &links); err != nil {
			return "", fmt.Errorf("links: %s", describeJSONError(err))
		}
		if links.Next != nil {
			return *links.Next, nil
		}
	}
	return "", nil
}

func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "value"
		}
		return fmt.Sprintf("field %s: JSON %s where %s is expected", f, te.Value, te.Type)
	}
	return err.Error()
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return strconv.Quote(s)
}
