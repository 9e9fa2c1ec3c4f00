"""Set where CloudKitty's processor starts rating a scope.

usage: cloudkitty_scope.py CLOUDKITTY_CONF SCOPE_ID LAST_PROCESSED_ISO8601

CloudKitty 17 starts a scope it has never rated at the month's start
(utils.check_time_state) and has no [collect] begin option; its API cannot
create a scope with a timestamp (POST /v2/scope) or reset one without a
processor listening on RPC (PUT /v2/scope). This sets the scope's last
processed period start through CloudKitty's own storage_state, as the
processor would: the next period it rates is LAST_PROCESSED + period.
Run it while the processor is stopped, with /usr/bin/python3.
"""
import sys

from oslo_config import cfg

from cloudkitty import service
from cloudkitty import storage_state
from cloudkitty.utils import tz as tzutils


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    conf, scope, ts = sys.argv[1:]
    service.prepare_service([sys.argv[0], "--config-file", conf])
    storage_state.StateManager().set_last_processed_timestamp(
        scope, tzutils.dt_from_iso(ts),
        fetcher=cfg.CONF.fetcher.backend,
        collector=cfg.CONF.collect.collector,
        scope_key=cfg.CONF.collect.scope_key)


if __name__ == "__main__":
    main()
