// Package testbed holds what Go code needs of the OpenStack testbed
// (README.md documents the scripts): the helper `tapflow lab up --register
// --nova-conf` runs — the testbed's nova-api cannot boot servers, so
// lib/nova_servers.py writes them through Nova's own objects — and the
// reader of the env file up.sh writes.
package testbed

import (
	"bufio"
	_ "embed"
	"os"
	"strings"
)

// NovaServersPy is lib/nova_servers.py.
//
//go:embed lib/nova_servers.py
var NovaServersPy []byte

// ReadEnv reads STATE_DIR/env as up.sh writes it: KEY=value lines
// (endpoints, the admin credentials, NOVA_CONF).
func ReadEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}
