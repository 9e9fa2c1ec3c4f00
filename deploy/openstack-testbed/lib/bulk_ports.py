"""Clone a Neutron port COUNT times straight into Neutron's SQLite database.

Usage: bulk_ports.py NEUTRON_DB TEMPLATE_PORT_ID COUNT

Creating ports through the API costs ~0.25 s each on the SQLite testbed
(IPAM), far too slow for a 10,000-port benchmark. This copies the template
port's rows (ports, standardattributes, ipallocations, ml2_port_bindings,
portsecuritybindings, securitygroupportbindings) with fresh ids, MACs
fa:16:3f:xx:xx:xx, device ids bench-N and consecutive addresses after the
template's on its subnet; projects rotate over bench-project-0..99. The API
then lists them like any port.
"""
import ipaddress
import sqlite3
import sys
import uuid

db, template, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = sqlite3.connect(db)
cur = c.cursor()
port = cur.execute("select project_id, network_id, admin_state_up, status, device_owner, ip_allocation, standard_attr_id "
                   "from ports where id = ?", (template,)).fetchone()
if not port:
    sys.exit("template port %s not found" % template)
project, net, up, status, owner, ipalloc, sa = port
ip, subnet = cur.execute("select ip_address, subnet_id from ipallocations where port_id = ?", (template,)).fetchone()
binding = cur.execute("select host, vnic_type, profile, vif_type, vif_details, status from ml2_port_bindings where port_id = ?",
                      (template,)).fetchone()
psec = cur.execute("select port_security_enabled from portsecuritybindings where port_id = ?", (template,)).fetchone()
sgs = [r[0] for r in cur.execute("select security_group_id from securitygroupportbindings where port_id = ?", (template,))]
base = ipaddress.ip_address(ip)
for i in range(count):
    pid = str(uuid.uuid4())
    cur.execute("insert into standardattributes (resource_type, description, revision_number, created_at, updated_at) "
                "values ('ports', '', 0, datetime('now'), datetime('now'))")
    said = cur.lastrowid
    mac = "fa:16:3f:%02x:%02x:%02x" % ((i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
    cur.execute("insert into ports (project_id, id, name, network_id, mac_address, admin_state_up, status, device_id, "
                "device_owner, ip_allocation, standard_attr_id) values (?,?,?,?,?,?,?,?,?,?,?)",
                ("bench-project-%d" % (i % 100), pid, "bench-%d" % i, net, mac, up, status, "bench-%d" % i, owner, ipalloc, said))
    cur.execute("insert into ipallocations (port_id, ip_address, subnet_id, network_id) values (?,?,?,?)",
                (pid, str(base + 1 + i), subnet, net))
    if binding:
        cur.execute("insert into ml2_port_bindings (port_id, host, vnic_type, profile, vif_type, vif_details, status) "
                    "values (?,?,?,?,?,?,?)", (pid,) + binding)
    if psec:
        cur.execute("insert into portsecuritybindings (port_id, port_security_enabled) values (?,?)", (pid, psec[0]))
    for sg in sgs:
        cur.execute("insert into securitygroupportbindings (port_id, security_group_id) values (?,?)", (pid, sg))
c.commit()
print("cloned", count, "ports")
