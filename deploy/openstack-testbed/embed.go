// Package testbed embeds the OpenStack testbed's helper that `tapflow lab
// up --register --nova-conf` runs: the testbed's nova-api cannot boot
// servers, so lib/nova_servers.py writes them through Nova's own objects.
// The scripts themselves are documented in README.md.
package testbed

import _ "embed"

// NovaServersPy is lib/nova_servers.py.
//
//go:embed lib/nova_servers.py
var NovaServersPy []byte
