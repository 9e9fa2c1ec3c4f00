# deploy/openstack-testbed/openstack.mk — the OpenStack contract tests.
# Included by the top-level Makefile. `make test-openstack` installs the
# Debian packages (as root; a no-op when present), starts a real Keystone,
# Neutron, Nova and Octavia on 127.0.0.1 in a temporary directory (the test
# binary does that through up.sh/down.sh) and runs the contract tests of
# enrich/provider/openstack against them.
OPENSTACK_TESTBED := deploy/openstack-testbed
OPENSTACK_TESTFLAGS ?=

.PHONY: test-openstack openstack-testbed-install

openstack-testbed-install: ## Install the OpenStack testbed's Debian packages (root; fast when present).
	@$(OPENSTACK_TESTBED)/install.sh

test-openstack: openstack-testbed-install ## Contract tests against real Keystone/Neutron/Nova/Octavia servers (root, ~3 min).
	TAPFLOW_OPENSTACK=1 $(GO) test -race -count=1 -timeout 15m $(OPENSTACK_TESTFLAGS) ./enrich/provider/openstack/
