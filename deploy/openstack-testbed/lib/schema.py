"""Create the Neutron or Octavia schema in a SQLite database from the models.

Usage: schema.py neutron|octavia DB_URL

alembic migrations ALTER constraints, which SQLite does not support, so
(as the projects' own functional tests do) the schema is built from the
SQLAlchemy models and the caller stamps the migration head. For Octavia the
lookup tables are seeded as octavia/tests/functional/db/base.py does.
"""
import sys

import sqlalchemy as sa


def neutron(url):
    from neutron.db.migration.models import head
    head.get_metadata().create_all(sa.create_engine(url))


def octavia(url):
    from sqlalchemy import orm
    from octavia.common import constants as c
    from octavia.db import base_models, models

    engine = sa.create_engine(url)
    base_models.BASE.metadata.create_all(engine)
    s = orm.sessionmaker(bind=engine)()
    for names, cls in [
        (c.SUPPORTED_PROVISIONING_STATUSES, models.ProvisioningStatus),
        (c.SUPPORTED_HEALTH_MONITOR_TYPES, models.HealthMonitorType),
        (c.SUPPORTED_LB_ALGORITHMS, models.Algorithm),
        (c.SUPPORTED_PROTOCOLS, models.Protocol),
        (c.SUPPORTED_OPERATING_STATUSES, models.OperatingStatus),
        (c.SUPPORTED_SP_TYPES, models.SessionPersistenceType),
        (c.SUPPORTED_AMPHORA_ROLES, models.AmphoraRoles),
        (c.SUPPORTED_LB_TOPOLOGIES, models.LBTopology),
        (c.SUPPORTED_VRRP_AUTH, models.VRRPAuthMethod),
        (c.SUPPORTED_L7RULE_TYPES, models.L7RuleType),
        (c.SUPPORTED_L7RULE_COMPARE_TYPES, models.L7RuleCompareType),
        (c.SUPPORTED_L7POLICY_ACTIONS, models.L7PolicyAction),
        (c.SUPPORTED_CLIENT_AUTH_MODES, models.ClientAuthenticationMode),
    ]:
        for n in names:
            s.add(cls(name=n))
    s.flush()
    s.add(models.FlavorProfile(id=c.NIL_UUID, name='DELETED-PLACEHOLDER',
                               provider_name=c.DELETED, flavor_data='{}'))
    s.flush()
    s.add(models.Flavor(id=c.NIL_UUID, flavor_profile_id=c.NIL_UUID,
                        name='DELETED-PLACEHOLDER', enabled=False))
    s.flush()
    s.add(models.AvailabilityZoneProfile(id=c.NIL_UUID, name='DELETED-PLACEHOLDER',
                                         provider_name=c.DELETED,
                                         availability_zone_data='{}'))
    s.flush()
    s.add(models.AvailabilityZone(availability_zone_profile_id=c.NIL_UUID,
                                  name=c.NIL_UUID, enabled=False))
    s.commit()


{"neutron": neutron, "octavia": octavia}[sys.argv[1]](sys.argv[2])
