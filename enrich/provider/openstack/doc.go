// Package openstack is the OpenStack inventory provider: it reads the objects
// attribution needs from the real APIs (gophercloud v2) and keeps an
// inventory.Inventory current.
//
// A pass lists, with pagination drained and fields= trimming where the API
// supports it: Keystone projects (when authenticated); Neutron networks,
// subnets, ports, routers and floating IPs; Nova servers (all_tenants);
// Octavia load balancers, amphorae, pools and their members. Neutron (and
// Keystone when authenticated) are required: a pass that cannot read them
// fails and the last complete inventory stays in use. Nova and Octavia are
// best effort: a collection that fails keeps its previous values, the
// failure is logged and counted, and the pass still completes. Load
// balancers of a provider other than amphora (or its alias octavia, or
// empty) are skipped and counted; their pools go with them.
//
// Authentication: a clouds.yaml entry (Config.Cloud or $OS_CLOUD), else the
// OS_* environment variables (password, application credential or token),
// else Config.NoAuth's explicit endpoints for API servers that run without
// Keystone (tests, labs). Endpoints come from the Keystone catalog on
// Config.Interface (default internal) in Config.Region. Passwords, secrets
// and tokens are never logged and are scrubbed from every error.
//
// Lifecycle: New validates and starts nothing. The first Poll (what
// enrich.Engine.Load calls before capture is attached) or Run performs the
// cold start: passes with backoff from 1 s to 30 s until one completes,
// logging what it waits for. Run then reconciles every Config.Refresh and
// whenever Refresh is called; passes never overlap. Poll hands the engine
// each new inventory once (an unchanged cloud is not a change), and a
// failed pass's error once. Errors are counted on
// tapflow_inventory_errors_total{endpoint,code}; the age of the inventory in
// use is tapflow_inventory_age_seconds.
//
// Dump writes what the provider sees in the static inventory file format
// (docs/inventory.md), for `tapflow inventory dump`.
//
// The contract tests run against the real Keystone, Neutron, Nova and
// Octavia servers that deploy/openstack-testbed starts (make test-openstack).
package openstack
