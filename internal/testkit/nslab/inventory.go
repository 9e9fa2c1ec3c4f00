//go:build linux

package nslab

import (
	"fmt"
	"strings"
)

// Inventory is an inventory file (docs/inventory.md) for these VMs: one
// project (tenant), network net-lab and subnet subnet-lab (the labs'
// 10.213.7.0/24), and per VM a Nova port port-<name> with its MAC and
// address, owned by server server-<name>. Callers write it with the mode
// and owner they need.
func Inventory(tenant string, vms ...*VM) string {
	var b strings.Builder
	fmt.Fprintf(&b, `projects:
  - {id: %[1]s, name: lab}
networks:
  - {id: net-lab, name: lab, project_id: %[1]s, shared: false, "router:external": false}
subnets:
  - {id: subnet-lab, network_id: net-lab, cidr: 10.213.7.0/24, gateway_ip: null, ip_version: 4}
ports:
`, tenant)
	for _, vm := range vms {
		fmt.Fprintf(&b, "  - {id: port-%s, network_id: net-lab, project_id: %s, mac_address: %q, device_owner: \"compute:nova\", device_id: server-%s, fixed_ips: [{subnet_id: subnet-lab, ip_address: %s}]}\n",
			vm.Name, tenant, vm.MAC.String(), vm.Name, vm.IP)
	}
	b.WriteString("servers:\n")
	for _, vm := range vms {
		fmt.Fprintf(&b, "  - {id: server-%s, name: %s, tenant_id: %s}\n", vm.Name, vm.Name, tenant)
	}
	return b.String()
}
