package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"go.yaml.in/yaml/v3"
)

// unregister deletes what reg.Created lists, newest first. Objects
// already gone are skipped; the first other failure is returned after
// trying the rest.
func unregister(ctx context.Context, api *osAPI, reg *Registration, log *slog.Logger) error {
	var errs []error
	// Load balancers first (cascade: listeners, pools, members, amphorae
	// and their ports), waiting until Octavia has released the VIP port.
	for _, c := range reg.Created {
		if c.Kind != "loadbalancer" {
			continue
		}
		err := call(ctx, api.octavia, "DELETE", "lbaas/loadbalancers/"+c.ID+"?cascade=true", nil, nil, nil, 204)
		if !gone(err) && !gophercloud.ResponseCodeIs(err, http.StatusConflict) {
			errs = append(errs, err)
			continue
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			var out struct {
				LB octaviaLB `json:"loadbalancer"`
			}
			err := call(ctx, api.octavia, "GET", "lbaas/loadbalancers/"+c.ID, nil, nil, &out, 200)
			if gophercloud.ResponseCodeIs(err, http.StatusNotFound) || out.LB.ProvisioningStatus == "DELETED" {
				break
			}
			if out.LB.ProvisioningStatus == "ACTIVE" || out.LB.ProvisioningStatus == "ERROR" {
				// a delete refused while PENDING_*: ask again
				call(ctx, api.octavia, "DELETE", "lbaas/loadbalancers/"+c.ID+"?cascade=true", nil, nil, nil, 204)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	for i := len(reg.Created) - 1; i >= 0; i-- {
		c := reg.Created[i]
		if c.Kind == "loadbalancer" {
			continue
		}
		err := retryDelete(ctx, log, c, func() error { return deleteObject(ctx, api, c) })
		if !gone(err) {
			log.Warn("lab down: could not delete an OpenStack object", "kind", c.Kind, "id", c.ID, "name", c.Name, "err", err)
			errs = append(errs, fmt.Errorf("delete %s %s (%s): %w", c.Kind, c.ID, c.Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("lab down: %d OpenStack objects not deleted: %w", len(errs), errors.Join(errs...))
	}
	log.Info("lab down: OpenStack objects deleted", "objects", len(reg.Created))
	return nil
}

// gone: the object no longer exists (deleted now or before).
func gone(err error) bool {
	return err == nil || gophercloud.ResponseCodeIs(err, http.StatusNotFound)
}

// Deletes are retried this long on a transient answer.
const (
	deleteRetryFor     = 90 * time.Second
	deleteRetryBackoff = 250 * time.Millisecond
)

// retryDelete calls del until the object is gone, the answer is not
// transient, or deleteRetryFor has passed. Transient: a server error
// (5xx; a loaded Neutron on SQLite answers 500 now and then, CI saw it on
// DELETE networks) or a conflict (409; Neutron may still be removing a
// network's ports). A delete is idempotent, so a retry is safe: a 404
// after a 500 means the first attempt did it.
func retryDelete(ctx context.Context, log *slog.Logger, c Created, del func() error) error {
	backoff := deleteRetryBackoff
	deadline := time.Now().Add(deleteRetryFor)
	for attempt := 1; ; attempt++ {
		err := del()
		if gone(err) || !transientAPIError(err) || time.Now().Add(backoff).After(deadline) {
			return err
		}
		log.Info("lab down: OpenStack answered with a transient error; retrying", "kind", c.Kind, "id", c.ID,
			"attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// postRetrying creates an object with post. On a server error (5xx: a
// loaded Neutron on SQLite answered POST floatingips with 500 in CI) it
// asks find whether the object exists anyway — the failure may come after
// the commit — and adopts it, else posts again, for up to deleteRetryFor.
// Other errors return at once.
func postRetrying(ctx context.Context, log *slog.Logger, what string, post func() error, find func() (bool, error)) error {
	backoff := deleteRetryBackoff
	deadline := time.Now().Add(deleteRetryFor)
	for attempt := 1; ; attempt++ {
		err := post()
		var e gophercloud.ErrUnexpectedResponseCode
		if err == nil || !errors.As(err, &e) || e.Actual < 500 || time.Now().Add(backoff).After(deadline) {
			return err
		}
		log.Info("register: OpenStack answered a create with a server error; checking and retrying", "object", what,
			"attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		if ok, ferr := find(); ferr == nil && ok {
			log.Info("register: the create was made despite the error; adopting it", "object", what)
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// transientAPIError: an answer worth asking again (5xx or 409).
func transientAPIError(err error) bool {
	var e gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &e) {
		return false
	}
	return e.Actual >= 500 || e.Actual == http.StatusConflict
}

// deleteObject deletes one object that lab up created.
func deleteObject(ctx context.Context, api *osAPI, c Created) error {
	var err error
	switch c.Kind {
	case "project":
		err = call(ctx, api.keystone, "DELETE", "projects/"+c.ID, nil, nil, nil, 204)
	case "network":
		err = call(ctx, api.neutron, "DELETE", "networks/"+c.ID, nil, nil, nil, 204)
	case "port":
		err = call(ctx, api.neutron, "DELETE", "ports/"+c.ID, nil, nil, nil, 204)
	case "router":
		err = call(ctx, api.neutron, "DELETE", "routers/"+c.ID, nil, nil, nil, 204)
	case "router_interface":
		err = call(ctx, api.neutron, "PUT", "routers/"+c.Parent+"/remove_router_interface", nil, map[string]any{"port_id": c.ID}, nil, 200)
	case "floatingip":
		err = call(ctx, api.neutron, "DELETE", "floatingips/"+c.ID, nil, nil, nil, 204)
	case "flavor":
		err = call(ctx, api.octavia, "DELETE", "lbaas/flavors/"+c.ID, nil, nil, nil, 204)
	case "flavorprofile":
		err = call(ctx, api.octavia, "DELETE", "lbaas/flavorprofiles/"+c.ID, nil, nil, nil, 204)
	default:
		err = fmt.Errorf("unknown kind %q", c.Kind)
	}
	return err
}

// unregisterState deletes the OpenStack objects a lab's state directory
// records (Teardown). Credentials come from the OS_* variables.
func unregisterState(ctx context.Context, stateDir string, log *slog.Logger) error {
	b, err := os.ReadFile(filepath.Join(stateDir, stateMarker))
	if err != nil {
		return nil // no state: nothing registered that we know of
	}
	var st stateFile
	if err := yaml.Unmarshal(b, &st); err != nil || st.Registration == nil || len(st.Registration.Created) == 0 {
		return nil
	}
	api, err := dialOpenStack(ctx, RegisterOptions{AuthURL: st.Registration.AuthURL})
	if err != nil {
		return fmt.Errorf("%w; the lab's OpenStack objects stay listed in %s until `tapflow lab down` runs with the credentials", err, stateDir)
	}
	return unregister(ctx, api, st.Registration, log)
}
