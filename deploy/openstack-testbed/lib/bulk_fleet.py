"""Grow the testbed's Neutron to a fleet-sized cloud straight in its SQLite database.

Usage: bulk_fleet.py NEUTRON_DB VM_PORT ROUTER FIP PORTS ROUTERS FIPS

Creating objects through the API costs ~0.25 s each on the SQLite testbed
(IPAM), so a 100k-port cloud would take hours. This clones templates made
through the API, the way bulk_ports.py does for ports:

  - VM_PORT (a compute:nova port on a tenant subnet) PORTS times, with fresh
    ids, MACs fa:16:3e:xx:xx:xx, device ids fleet-vm-N and consecutive
    addresses after the template's; projects rotate over fleet-project-0..999;
  - ROUTER (a router with an external gateway) ROUTERS times, each with its
    own gateway port (a clone of the template's, next address on the
    external subnet) and the template's extra attributes;
  - FIP (a floating IP associated with VM_PORT) FIPS times, each with its
    own floating port on the external network, associated with the i-th
    cloned VM port and the i-th cloned router (round robin).

Every row Neutron joins when it lists a port, router or floating IP is
copied (standardattributes, ipallocations, ml2_port_bindings,
portsecuritybindings, securitygroupportbindings, routerports,
router_extra_attributes), so the API lists the clones like any object.
"""
import ipaddress
import sqlite3
import sys
import uuid

db, vm_tmpl, router_tmpl, fip_tmpl = sys.argv[1:5]
n_ports, n_routers, n_fips = (int(a) for a in sys.argv[5:8])
c = sqlite3.connect(db)
cur = c.cursor()


def row(table, where, args):
    cur.execute("select * from %s where %s" % (table, where), args)
    cols = [d[0] for d in cur.description]
    r = cur.fetchone()
    return None if r is None else dict(zip(cols, r))


def rows(table, where, args):
    cur.execute("select * from %s where %s" % (table, where), args)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def insert(table, r):
    cols = list(r)
    cur.execute("insert into %s (%s) values (%s)" % (table, ",".join(cols), ",".join("?" * len(cols))),
                [r[k] for k in cols])


def std_attr(resource):
    cur.execute("insert into standardattributes (resource_type, description, revision_number, created_at, updated_at) "
                "values (?, '', 0, datetime('now'), datetime('now'))", (resource,))
    return cur.lastrowid


class PortCloner:
    """Clones one template port with consecutive addresses on its subnet."""

    def __init__(self, port_id, mac_prefix):
        self.port = row("ports", "id = ?", (port_id,))
        if self.port is None:
            sys.exit("template port %s not found" % port_id)
        alloc = row("ipallocations", "port_id = ?", (port_id,))
        self.alloc = alloc
        self.next_ip = ipaddress.ip_address(alloc["ip_address"]) + 1
        self.binding = row("ml2_port_bindings", "port_id = ?", (port_id,))
        self.psec = row("portsecuritybindings", "port_id = ?", (port_id,))
        self.sgs = rows("securitygroupportbindings", "port_id = ?", (port_id,))
        self.mac_prefix = mac_prefix
        self.n = 0

    def clone(self, project, device_id, name):
        pid = str(uuid.uuid4())
        p = dict(self.port, id=pid, project_id=self.port["project_id"] if project is None else project, device_id=device_id, name=name,
                 mac_address="%s:%02x:%02x:%02x" % (self.mac_prefix, (self.n >> 16) & 0xff, (self.n >> 8) & 0xff, self.n & 0xff),
                 standard_attr_id=std_attr("ports"))
        insert("ports", p)
        ip = str(self.next_ip)
        insert("ipallocations", dict(self.alloc, port_id=pid, ip_address=ip))
        self.next_ip += 1
        self.n += 1
        if self.binding:
            insert("ml2_port_bindings", dict(self.binding, port_id=pid))
        if self.psec:
            insert("portsecuritybindings", dict(self.psec, port_id=pid))
        for sg in self.sgs:
            insert("securitygroupportbindings", dict(sg, port_id=pid))
        return pid, ip


vms = PortCloner(vm_tmpl, "fa:16:3e")
vm_ports = []
for i in range(n_ports):
    project = "fleet-project-%d" % (i % 1000)
    vm_ports.append((project,) + vms.clone(project, "fleet-vm-%d" % i, "fleet-vm-%d" % i))

router = row("routers", "id = ?", (router_tmpl,))
if router is None or not router["gw_port_id"]:
    sys.exit("template router %s not found or without a gateway" % router_tmpl)
extra = row("router_extra_attributes", "router_id = ?", (router_tmpl,))
gw_type = row("routerports", "port_id = ?", (router["gw_port_id"],))["port_type"]
gws = PortCloner(router["gw_port_id"], "fa:16:3d")
routers = []
for i in range(n_routers):
    rid = str(uuid.uuid4())
    project = "fleet-project-%d" % (i % 1000)
    gw, _ = gws.clone(None, rid, "")  # gateway ports keep the template's (Neutron's) project
    insert("routers", dict(router, id=rid, project_id=project, name="fleet-router-%d" % i, gw_port_id=gw,
                           standard_attr_id=std_attr("routers")))
    if extra:
        insert("router_extra_attributes", dict(extra, router_id=rid))
    insert("routerports", {"router_id": rid, "port_id": gw, "port_type": gw_type})
    routers.append(rid)

fip = row("floatingips", "id = ?", (fip_tmpl,))
if fip is None:
    sys.exit("template floating IP %s not found" % fip_tmpl)
fports = PortCloner(fip["floating_port_id"], "fa:16:3c")
if n_fips > len(vm_ports):
    sys.exit("more floating IPs (%d) than cloned VM ports (%d)" % (n_fips, len(vm_ports)))
for i in range(n_fips):
    fid = str(uuid.uuid4())
    project, vm, vm_ip = vm_ports[i]
    fp, fip_ip = fports.clone(None, fid, "")
    insert("floatingips", dict(fip, id=fid, project_id=project, floating_ip_address=fip_ip, floating_port_id=fp,
                               fixed_port_id=vm, fixed_ip_address=vm_ip,
                               router_id=routers[i % len(routers)] if routers else fip["router_id"],
                               last_known_router_id=None, standard_attr_id=std_attr("floatingips")))
c.commit()
print("cloned %d ports, %d routers (with gateway ports), %d floating IPs (with floating ports)" % (n_ports, n_routers, n_fips))
