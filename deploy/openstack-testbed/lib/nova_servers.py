"""Create Nova instances the way nova-compute and the conductor would.

Usage: nova_servers.py NOVA_CONF SPEC...
SPEC:  UUID,NAME,PROJECT,PORT_ID,MAC,IP[,FLOATING_IP]

The testbed runs nova-api only (no conductor, scheduler, placement or
hypervisor), so POST /servers cannot work. This writes the instance, its
network info cache (the port with its MAC, fixed and floating address) and
its cell mapping through Nova's own objects; GET /servers/detail then shows
ACTIVE servers, with security groups resolved live from the real Neutron.
"""
import sys

from nova import config, context, objects
from nova.network import model as nm
from oslo_utils import timeutils

config.parse_args(['nova-servers', '--config-file', sys.argv[1]])
objects.register_all()
ctxt = context.get_admin_context()
try:
    flavor = objects.Flavor.get_by_name(ctxt, 'm1.small')
except Exception:
    flavor = objects.Flavor(context=ctxt, name='m1.small', memory_mb=2048, vcpus=1,
                            root_gb=20, ephemeral_gb=0, swap=0, flavorid='2',
                            extra_specs={})
    flavor.create()
    # reload: microversions >= 2.47 need the fully loaded flavor (extra_specs)
    flavor = objects.Flavor.get_by_name(ctxt, 'm1.small')
cell = [c for c in objects.CellMappingList.get_all(ctxt) if c.name == 'cell1'][0]
for spec in sys.argv[2:]:
    f = spec.split(',')
    uuid, name, project, port_id, mac, ip = f[:6]
    fip = f[6] if len(f) > 6 and f[6] else None
    with context.target_cell(ctxt, cell) as cctxt:
        inst = objects.Instance(context=cctxt, uuid=uuid, display_name=name, hostname=name,
                                project_id=project, user_id='testbed', host='compute-1',
                                node='compute-1', vm_state='active', power_state=1,
                                task_state=None, flavor=flavor, instance_type_id=flavor.id,
                                memory_mb=flavor.memory_mb, vcpus=flavor.vcpus,
                                root_gb=flavor.root_gb, ephemeral_gb=0,
                                availability_zone='nova', launched_at=timeutils.utcnow(),
                                image_ref='d0000000-0000-0000-0000-000000000001', metadata={})
        inst.create()
        ips = [nm.FixedIP(address=ip,
                          floating_ips=[nm.IP(address=fip, type='floating')] if fip else [])]
        vif = nm.VIF(id=port_id, address=mac, type='ovs', active=True,
                     network=nm.Network(id='net', label='net', bridge='br-int',
                                        subnets=[nm.Subnet(cidr=ip + '/32', ips=ips)]))
        inst.info_cache = objects.InstanceInfoCache(context=cctxt, instance_uuid=uuid,
                                                     network_info=nm.NetworkInfo([vif]))
        inst.info_cache.save()
    objects.InstanceMapping(context=ctxt, instance_uuid=uuid, cell_mapping=cell,
                            project_id=project).create()
    print('created server', uuid, name)
