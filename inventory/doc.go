// Package inventory is the OpenStack object model that attribution needs,
// with the APIs' own field names, and the static file provider that reads it.
//
// An inventory is a plain value: a list per API collection (projects,
// networks, subnets, ports, routers, floatingips, servers, loadbalancers,
// amphorae, pools), each object carrying the fields the Neutron, Nova,
// Keystone and Octavia APIs return under the same names, so API output can be
// pasted into an inventory file. Fields attribution does not read are
// ignored.
//
// Parse and Load reject a file only when it cannot be read as an inventory at
// all (syntax, a value of the wrong type, an object without an id, two objects
// with one id); the error names the collection, the object and the field.
// Values that parse but make no sense (a malformed MAC, CIDR or IP, a port on
// an unknown network) are not this package's business: the snapshot builder
// skips the object and reports an anomaly, so one bad port never stops
// attribution for the rest of the cloud.
//
// File watches a file and returns a new inventory when its content changes.
//
// The package is a leaf of the module: it imports nothing from tapflow
// (leaf_test.go checks, and that its subpackage synth, the generator of
// synthetic clouds, imports nothing but it), so the attribution stage
// (enrich, enrich/snapshot, enrich/nodeview), the inventory providers
// (enrich/provider/...), the inventory service (enrich/invserve), reports,
// lab and synthetic share one model without depending on each other.
package inventory
