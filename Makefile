# tapflow — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/tapflow
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/tapflow/tapflow/internal/version.Version=$(VERSION) -X github.com/tapflow/tapflow/internal/version.Revision=$(REVISION)
DEMO_DIR ?= demo-data
DEMO_SECONDS ?= 20
# Go test flags; override e.g. TESTFLAGS='-run TestX -v'.
TESTFLAGS ?=

include bpf/bpf.mk
include deploy/openstack-testbed/openstack.mk
include compat/compat.mk

# As root (CI), `make test` also runs the OpenStack contract tests against
# real Keystone/Neutron/Nova/Octavia servers (installed on first use).
IS_ROOT := $(filter 0,$(shell id -u))

.DEFAULT_GOAL := help
.PHONY: help build package test test-go test-fuzz test-openstack-then-fuzz fuzz examples-deps test-openstack-maybe test-short demo demo-synthetic lab-down test-e2e bench lint generate check-generate deps clean

help: ## List the targets.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build bin/tapflow (static, no cgo).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/tapflow

# nfpm (github.com/goreleaser/nfpm/v2) is run at a pinned version with
# `go run pkg@version` (the Go build cache keeps the binary) instead of
# being a dependency of the main module: only packaging needs it.
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DIST ?= dist
DEB_VERSION ?= $(shell deploy/package/version.sh)

package: ## Build the Debian package dist/tapflow_<version>_amd64.deb (nfpm; binary, systemd units, example config, user tapflow).
	@mkdir -p $(DIST)
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(DIST)/tapflow ./cmd/tapflow
	TAPFLOW_BIN=$(DIST)/tapflow TAPFLOW_VERSION=$(DEB_VERSION) $(NFPM) package --config deploy/package/nfpm.yaml --packager deb --target $(DIST)/tapflow_$(DEB_VERSION)_amd64.deb
	@rm -f $(DIST)/tapflow

# One image for the agent and the collector, FROM scratch: the static
# binary, Debian's CA bundle, passwd/group, the example config. Built with
# podman (or buildah) without pulling anything (docs/containers.md).
IMAGE ?= localhost/tapflow:$(VERSION)
IMAGE_ARCHIVE ?=
.PHONY: image
image: ## Build the container image $(IMAGE) (agent and collector; podman/buildah, no registry; as root installs podman). IMAGE_ARCHIVE=f.tar also saves an OCI archive.
	@mkdir -p $(DIST)/image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(DIST)/image/tapflow ./cmd/tapflow
	IMAGE='$(IMAGE)' TAPFLOW_BIN=$(DIST)/image/tapflow VERSION='$(VERSION)' REVISION='$(REVISION)' IMAGE_ARCHIVE='$(IMAGE_ARCHIVE)' deploy/container/build.sh

deps: ## Install what tests and generate need (Debian packages, as root; idempotent and fast when present).
	@deploy/scripts/deps.sh

# The phases of `make test` are independent and mostly wait (chaos runs,
# namespace scenarios, OpenStack servers starting), so they run at once:
# the main go test, the compat module, the OpenStack contract tests,
# the versitygw build (the tests that need it wait on its lock instead of
# building it again) and the generated-code check. Each phase's output is
# printed whole when it ends (make -O), so nothing interleaves; any
# failing phase fails `make test`. Bounded fuzzing runs after the
# OpenStack tests on one core: next to test-go on both cores it made the
# load-sensitive tests flaky, and test-go is the longest phase anyway.
TEST_PHASES := test-go compat-test versitygw check-generate test-openstack-then-fuzz

test-openstack-then-fuzz:
	@rc=0; $(MAKE) --no-print-directory test-openstack-maybe || rc=1; \
	 $(MAKE) --no-print-directory test-fuzz TEST_FUZZ_PARALLEL=1 || rc=1; exit $$rc

test: deps ## Run every test (-race). As root this includes the eBPF, network-namespace and OpenStack contract tests.
	@$(MAKE) --no-print-directory -j$(words $(TEST_PHASES)) -Otarget $(TEST_PHASES)

# go test -json piped through internal/testkit/testsummary prints what a
# plain go test prints (package results; the whole output of every failing
# test, of a timed-out one and of a failing package), then every skipped
# test with its reason and kind (missing prerequisite, -short, deliberate)
# and every failed test; pipefail and its exit code fail the phase when go
# test fails. TESTFLAGS=-v prints every line as it comes.
TESTSUMMARY = $(GO) run ./internal/testkit/testsummary $(filter -v,$(TESTFLAGS))

test-go: examples-deps ## The main module's tests (-race), the biggest phase of make test; ends with the list of skipped tests.
	@start=$$(date +%s); set -o pipefail; $(GO) test -json -race -shuffle=on -timeout 35m -count=1 $(TESTFLAGS) ./... | $(TESTSUMMARY) && \
	 echo "test-go: passed in $$(($$(date +%s) - start))s"

examples-deps: ## npm ci for the JavaScript example subscriber (examples/js-subscriber), which test-go runs; a no-op when installed.
	@cd examples/js-subscriber && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }

# Native Go fuzzing. make test runs TEST_FUZZ_TARGETS (package:Target)
# for TEST_FUZZTIME each (the wire decoders, BodyCodec, inventory deltas,
# the inventory file, lookup requests, the NATS version check; ~2 min in all);
# make fuzz runs every Fuzz* target of the module for FUZZTIME each. A
# crasher fails the run and is written to the package's
# testdata/fuzz/<Target>/: commit it as a seed once fixed.
FUZZTIME ?= 5m
TEST_FUZZTIME ?= 10s
TEST_FUZZ_TARGETS := ./schemas:FuzzWireFlow ./schemas:FuzzWireFlowRows ./schemas:FuzzWireMeter ./schemas:FuzzWireMeterRows
TEST_FUZZ_TARGETS += ./schemas:FuzzBodyCodec
TEST_FUZZ_TARGETS += ./enrich/provider/natsinv:FuzzDecodeDelta ./inventory:FuzzParse ./enrich/lookup:FuzzHandle
TEST_FUZZ_TARGETS += ./transport:FuzzVersionAtLeast
TEST_FUZZ_TARGETS += ./transport/consume:FuzzCheckHeaders ./transport:FuzzDLQEvictions
FUZZ_RUN = $(GO) test -run '^$$' -fuzzminimizetime 10s
TEST_FUZZ_PARALLEL ?= 2

test-fuzz: ## Bounded fuzzing (part of make test): TEST_FUZZ_TARGETS for TEST_FUZZTIME each.
	@start=$$(date +%s); failed=; log=$$(mktemp); for t in $(TEST_FUZZ_TARGETS); do \
	  for try in 1 2; do \
	   $(FUZZ_RUN) -parallel $(TEST_FUZZ_PARALLEL) -fuzz "^$${t#*:}\$$" -fuzztime $(TEST_FUZZTIME) $${t%%:*} >$$log 2>&1 && break; \
	   if [ $$try = 1 ] && ! grep -q 'Failing input written' $$log; then echo "test-fuzz: $$t: the fuzzing engine failed without an input (a loaded machine); once more:"; tail -n 3 $$log; continue; fi; \
	   cat $$log; failed="$$failed $$t"; break; \
	  done; \
	 done; rm -f $$log; \
	 if [ -n "$$failed" ]; then echo "test-fuzz: FAILED:$$failed"; exit 1; fi; \
	 echo "test-fuzz: $(words $(TEST_FUZZ_TARGETS)) targets passed in $$(($$(date +%s) - start))s"

fuzz: ## Every Fuzz* target of the module (go test -list '^Fuzz' ./...) for FUZZTIME each (default 5m); lists the failing ones at the end.
	@failed=; while read -r pkg t; do echo "fuzz: $$pkg $$t for $(FUZZTIME)"; \
	  $(FUZZ_RUN) -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg || failed="$$failed $$pkg:$$t"; \
	 done < <($(GO) test -list '^Fuzz' ./... | awk '/^Fuzz/ {f[n++] = $$1} /^ok / {for (i = 0; i < n; i++) print $$2, f[i]; n = 0}'); \
	 if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed"; exit 1; fi

test-openstack-maybe:
	@$(if $(IS_ROOT),start=$$(date +%s); $(MAKE) --no-print-directory test-openstack && echo "test-openstack: passed in $$(($$(date +%s) - start))s",echo "test: not root: OpenStack contract tests skipped (make test-openstack as root runs them)")

# A test that needs root, eBPF or a Debian package skips as a non-root
# user (failing instead with CI set: internal/testkit/prereq), so
# test-short passes without privileges, e.g. as a throwaway user:
#   useradd -m tapflowtest; cp -r . ~tapflowtest/tapflow; chown -R tapflowtest: ~tapflowtest/tapflow
#   su tapflowtest -c 'cd ~/tapflow && GOFLAGS=-mod=mod GOPROXY=$(go env GOPROXY) make test-short'
# (make test runs internal/testkit/prereq's TestShortAsNonRoot, which does
# this for the eBPF package.) The S3 server the tests run is built first,
# as make test does, so no test spends its timeout building it; the
# package timeout is test-go's (internal/app's stream soak runs in -short).
test-short: versitygw ## The tests without the long runs (-short: no chaos, lab suite, disk-full or memory-limit runs), -race; as a non-root user the tests needing root, eBPF or missing packages skip, listed at the end (with CI set they fail).
	@set -o pipefail; $(GO) test -json -race -short -timeout 35m $(TESTFLAGS) ./... | $(TESTSUMMARY)

demo: build ## As root: a mini cloud in namespaces, real traffic captured by eBPF → Parquet → table. Otherwise ~20s of synthetic flows → Parquet → table.
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory deps && deploy/lab/demo.sh $(BIN) $(DEMO_DIR)/lab; \
	 else deploy/scripts/demo.sh $(BIN) $(DEMO_DIR) $(DEMO_SECONDS); fi

demo-synthetic: build ## The pipeline for ~20s on synthetic flows (no root), then the tenant × zone × direction table from Parquet.
	@deploy/scripts/demo.sh $(BIN) $(DEMO_DIR) $(DEMO_SECONDS)

lab-down: build ## Remove every namespace lab left behind (also after a crash).
	@$(BIN) lab down --all

test-e2e: deps ## The lab acceptance suite alone (root, ~3 min; also part of make test).
	$(GO) test -race -count=1 -timeout 15m -v -run 'TestScenarios|TestFailedUpLeavesNothing|TestDownAfterCrash|TestPreflightMissingPackages' ./lab/

# Every benchmark line of make bench is also written to BENCH_OUT; the
# last step prints the figures of the performance goals from it as one
# table, each with its baseline from the same run (docs/architecture.md).
BENCH_OUT ?= bin/bench.txt

bench: ## Go benchmarks: end-to-end pipeline vs JSON-lines baseline, codecs, Parquet, collector rows/s and peak RSS, agent userspace ns/record (binary record vs text path), message checks, publish into R1 vs R3, a fleet of 200 agents on an R3 cluster with three collectors for 10 minutes (docs/capacity.md), tapflow audit vs report's column reader, inventory snapshots at 100k ports and 1,000 agents, an agent's inventory memory at 1M ports (~7 min), freshness flow end → Parquet at roll_age 5m and 30s (~13 min), the tapflow agent process live at 100k/200k records/s, lz4 and none: CPU ns/record, RSS (~5 min), eBPF (root); then one table of the goal figures with their baselines.
	@mkdir -p $(dir $(BENCH_OUT)) && : > $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem -benchtime 3x ./internal/testkit/benchpipe/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench . -skip 'Fleet|1000Agents|AgentInventoryMemory' -benchmem ./schemas/ ./sinks/... ./transport/... ./enrich/... ./synthetic/ ./bpf/source/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench AgentInventoryMemory -benchtime 1x -timeout 30m ./enrich/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench 'Fleet|1000Agents' -benchmem -timeout 40m ./enrich/provider/natsinv/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench PublishReplicas -benchmem ./internal/app/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench Freshness -benchtime 1x -timeout 30m ./internal/app/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench FleetR3 -benchtime 1x -timeout 40m ./internal/app/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench AgentLive -benchtime 1x -timeout 15m ./internal/app/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench Audit -benchmem -benchtime 3x ./internal/audit/ | tee -a $(BENCH_OUT)
	@# bpf/source ran above (its benchmarks need no root)
	@if [ "$$(id -u)" = 0 ]; then set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem $$($(GO) list ./bpf/... | grep -v '/bpf/source$$') | tee -a $(BENCH_OUT); else echo "bench: not root: eBPF per-packet benchmarks skipped"; fi
	@$(GO) run ./internal/testkit/benchtable $(BENCH_OUT)

lint: ## gofmt, go vet and the generated-code check.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run gofmt -w on the files above"; exit 1; }
	$(GO) vet ./...
	@$(MAKE) --no-print-directory compat-vet
	@$(MAKE) --no-print-directory check-generate

generate: bpf-generate ## Regenerate committed code: flow.v1/meter.v1 structs and docs/schema.md (schemas), the NATS permission sections of docs/security.md and docs/inventory-service.md (transport/roles), the eBPF objects (Debian clang).
	$(GO) generate ./schemas/... ./transport/roles/

check-generate: ## Fail when committed generated code is stale.
	$(GO) test -run TestGeneratedCodeIsCurrent ./schemas/
	$(GO) test -run TestGeneratedDocsAreCurrent ./transport/roles/
	@if command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ]; then $(MAKE) --no-print-directory bpf-check; \
	 else echo "check-generate: clang/libbpf-dev missing, eBPF object check skipped (make deps as root installs them)"; fi

clean: ## Remove build output and demo data.
	rm -rf bin dist $(DEMO_DIR)
