// Package lab builds a mini OpenStack cloud inside network namespaces and
// proves tapflow on it with real traffic (docs/lab.md).
//
// A Topology (YAML, deploy/lab/*.yaml) names projects, networks, routers,
// servers and Octavia load balancers. Resolve turns it, deterministically,
// into a Cloud: every object with its ID, MAC, addresses, namespace and
// device names. New validates and creates nothing; Lab.Up creates, under
// one prefix and without touching the host's own interfaces or routes: a
// hypervisor namespace with one bridge per network and a tap<port-id[:11]>
// veth per instance port, one namespace per VM, router namespaces with
// nftables NAT and a metadata responder, an internet namespace, and
// amphora namespaces running HAProxy (and keepalived for ACTIVE_STANDBY),
// then writes the matching static inventory file. Teardown removes a lab
// by its prefix alone, so it also cleans up after a crash.
//
// Lab.Drive runs transfers of exact payload sizes between named endpoints
// from inside the namespaces, using the tapflow binary itself as client
// and server (HelperMain: `tapflow lab serve|send`). Lab.StartPipeline
// runs `tapflow run` (source ebpf, capture on tap*) inside the hypervisor
// namespace. RunScenario ties it together for a Scenario (declared as
// data: topology, steps, expected tenant × zone × direction table) and
// checks the Parquet output against the expectations and against the
// kernel meters (byte-exact conservation).
package lab
