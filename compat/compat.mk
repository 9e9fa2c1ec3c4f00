# compat/compat.mk — storage compatibility and S3 test server targets.
# Included by the top-level Makefile (`include compat/compat.mk`).

VERSITYGW_VERSION := v1.8.0
# Same place internal/testkit/versitygw looks (os.UserCacheDir): shared by every
# clone on the machine, so CI's fresh clone does not rebuild it.
VERSITYGW_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tapflow/versitygw-$(VERSITYGW_VERSION)
VERSITYGW_BIN := $(VERSITYGW_DIR)/versitygw

.PHONY: versitygw compat-test compat-vet

# Under the lock internal/testkit/versitygw takes (flock on .versitygw.lock): a test
# that needs the binary while this builds it waits, then uses it.
versitygw: ## Build the S3 server the tests run (versitygw, Apache-2.0) into ~/.cache/tapflow, once (~2-3 min cold).
	@mkdir -p $(VERSITYGW_DIR) && flock $(VERSITYGW_DIR)/.versitygw.lock $(SHELL) -c '\
	if $(GO) version -m $(VERSITYGW_BIN) 2>/dev/null | grep -Eq "mod[[:space:]]+github.com/versity/versitygw[[:space:]]+$(VERSITYGW_VERSION)"; then :; else \
	  echo "versitygw: building $(VERSITYGW_VERSION) into $(VERSITYGW_DIR) (once)"; start=$$(date +%s); \
	  cd $${TMPDIR:-/tmp} && GOBIN=$(VERSITYGW_DIR) CGO_ENABLED=0 GOFLAGS=-buildvcs=false $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION) && \
	  echo "versitygw: built in $$(($$(date +%s) - start))s"; fi'

# -mod=mod: compat/go.sum follows the main module's dependencies through
# the replace directive; a dependency added upstream is recorded here.
# Through testsummary (TESTSUMMARY, top-level Makefile) as test-go is.
compat-test: ## DuckDB read-back of collector output and the docs/queries.md cookbook (compat/ module, cgo).
	@start=$$(date +%s); set -o pipefail; (cd compat && GOFLAGS=-mod=mod $(GO) test -json -race -count=1 $(TESTFLAGS) ./...) | $(TESTSUMMARY) && \
	 echo "compat-test: passed in $$(($$(date +%s) - start))s"

compat-vet: ## go vet the compat module.
	cd compat && GOFLAGS=-mod=mod $(GO) vet ./...
