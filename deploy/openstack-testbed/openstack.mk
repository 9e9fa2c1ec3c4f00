# deploy/openstack-testbed/openstack.mk — the tests against real OpenStack.
# Included by the top-level Makefile. `make test-openstack` installs the
# Debian packages (as root; a no-op when present), starts one real
# Keystone, Neutron, Nova and Octavia on 127.0.0.1 in a temporary directory
# (up.sh), and runs against it, one package after the other:
#   - lab's register tests: `tapflow lab up --register` builds the Octavia
#     acceptance scenario in the APIs, tapflow reads its inventory from
#     them, the seed's table and conservation are checked, down deletes it;
#     and the new-VM test: a VM sends before its port exists, the port is
#     created through Neutron, inventory serve finds it for an agent that
#     holds only NATS credentials (TestRegisterNewVM);
#   - the contract tests of enrich/provider/openstack (they stop and
#     restart servers);
#   - billing/cloudkitty's test: cloudkitty-up.sh adds Debian's CloudKitty
#     17, Prometheus 2.42 and InfluxDB 1.6 to the same testbed (its
#     Keystone), one hour of two projects' traffic is rated by CloudKitty's
#     processor and checked to the byte through GET /v2/summary, then a late
#     correction is reprocessed (docs/billing.md).
# The testbed is stopped (down.sh) whatever happens; on a failure the
# servers' ERROR lines and tracebacks are printed first (the logs go with
# the temporary directory).
OPENSTACK_TESTBED := deploy/openstack-testbed
OPENSTACK_TESTFLAGS ?=

.PHONY: test-openstack openstack-testbed-install

openstack-testbed-install: ## Install the OpenStack testbed's Debian packages (root; fast when present).
	@$(OPENSTACK_TESTBED)/install.sh

test-openstack: openstack-testbed-install ## Register scenario + contract tests against real Keystone/Neutron/Nova/Octavia (root, ~6 min).
	@set -e; dir=$$(mktemp -d /tmp/tapflow-openstack-XXXXXX); \
	trap 'rc=$$?; if [ $$rc -ne 0 ]; then echo "==> server-side errors in the testbed logs (last 40 lines per log; Octavia worker restarts left out)"; for f in "'"$$dir"'"/log/*.log; do grep -v cotyledon "$$f" | grep -A12 -E " ERROR |Traceback" | tail -40 | sed "s|^|$${f##*/}: |"; done 2>/dev/null; fi; \
		$(OPENSTACK_TESTBED)/down.sh "'"$$dir"'" >/dev/null 2>&1 || true; [ -n "$$TAPFLOW_OPENSTACK_KEEP" ] || rm -rf "'"$$dir"'"' EXIT; \
	$(OPENSTACK_TESTBED)/up.sh "$$dir"; \
	echo "==> lab up --register against the testbed"; \
	TAPFLOW_OPENSTACK_STATE="$$dir" $(GO) test -race -count=1 -timeout 15m -run 'TestRegister' $(OPENSTACK_TESTFLAGS) ./lab/; \
	echo "==> OpenStack provider contract tests"; \
	TAPFLOW_OPENSTACK_STATE="$$dir" $(GO) test -race -count=1 -timeout 15m $(OPENSTACK_TESTFLAGS) ./enrich/provider/openstack/; \
	echo "==> CloudKitty rates tapflow's exact hour (billing/cloudkitty)"; \
	TAPFLOW_OPENSTACK_STATE="$$dir" $(GO) test -race -count=1 -timeout 20m -v -run 'TestCloudKitty' $(OPENSTACK_TESTFLAGS) ./billing/cloudkitty/
