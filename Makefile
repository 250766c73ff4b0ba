# Tool versions are pinned here and installed by `make tools`.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
STATICCHECK_VERSION        := v0.8.2
HELM_VERSION               := v3.22.0
GOBIN ?= $(shell go env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: all build test upgrade-test race lint generate check-generate tools bench fuzz tidy-check faults helm-check soak compare hotkey scale capacity deploy-scale sim-scale sim-deep sim-load

all: build lint test

# The commit the binary records (`sluice version`, sluice_build_info):
# `git rev-parse --short HEAD`, "-dirty" with uncommitted changes; empty
# without git, and the binary falls back on Go's VCS stamp or "unknown".
# VERSION, when given, overrides the release version of cmd/sluice/version.go.
REVISION ?= $(shell r=$$(git rev-parse --short HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || r=$$r-dirty; echo $$r; })
VERSION ?=
LDFLAGS := $(if $(REVISION),-X main.revision=$(REVISION)) $(if $(VERSION),-X main.version=$(VERSION))

# Every package, and the sluice binary into ./sluice.
build:
	go build ./...
	go build -ldflags '$(LDFLAGS)' -o sluice ./cmd/sluice

test:
	go test ./...

# A rolling upgrade under load from the previous release (built from git
# history; TestRollingUpgrade in test/upgrade_test.go, which go test ./...
# skips): 3 nodes of the old binary replaced one by one by this tree's;
# exact counts, no call errors, versions in sluice status. A few minutes
# on a cold build cache, about 25 s on a warm one.
upgrade-test:
	SLUICE_TEST_UPGRADE=1 go test -count=1 -v -timeout 20m -run '^TestRollingUpgrade$$' ./test/

race:
	go test -race ./bucket/... ./ring/... ./writeback/... ./transport/... ./cluster/...

tools:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@command -v protoc >/dev/null || (apt-get update -qq && apt-get install -y -qq protobuf-compiler)

# protoc 3.21.12 from Debian's protobuf-compiler; the plugins pinned above.
generate:
	protoc --proto_path=proto \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		sluice/v1/sluice.proto

check-generate: generate
	git diff --exit-code -- proto/ || (echo "generated code is stale: run make generate" && exit 1)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || (gofmt -l . && exit 1)
	go vet ./...
	go vet -tags faults ./test/faults/
	staticcheck ./...
	staticcheck -tags faults ./test/faults/

# The chart: helm lint (defaults and every option on), then helm template
# checked as deploy/kubernetes is (TestHelmChart, which fails here instead
# of skipping when helm is missing).
HELM_ALL_ON := tls.enabled=true,tls.clientCA.enabled=true,gossipKey.enabled=true,serviceMonitor.enabled=true
helm-check:
	helm lint --strict deploy/helm/sluice
	helm lint --strict deploy/helm/sluice --set $(HELM_ALL_ON)
	SLUICE_TEST_REQUIRE_HELM=1 go test -count=1 -run 'TestHelmChart|TestKubernetesManifests' ./cmd/sluice/

tidy-check:
	go mod tidy -diff

bench:
	go test -run '^$$' -bench . -benchmem ./bucket/... ./ring/... ./writeback/... ./cluster/... ./transport/...

FUZZTIME ?= 2m
# Every fuzz target of the module, FUZZTIME each (CI runs 50000 inputs each).
fuzz:
	bash .ci/fuzz.sh $(FUZZTIME)

# The fault tests on real hosts (network namespaces, iptables, signals):
# root only, they skip otherwise. Built with the faults tag, so `make test`
# leaves them out. FAULTS_RUN selects some (CI: .ci/run's selection).
FAULTS_RUN ?= .
faults:
	go test -tags faults -count=1 -v -timeout 20m -run '$(FAULTS_RUN)' ./test/faults/

# The soak (test/faults/soak_test.go; root): five hosts under mixed load, a
# fault every 30 s, for DURATION; every node's RSS, goroutines, open files
# and store size every 10 s into SOAK_OUT/soak.csv, plotted to
# SOAK_OUT/soak.png (gnuplot, installed from Debian when absent). The plot
# is drawn also when the test fails; the make exits with the test's status.
DURATION ?= 10m
SOAK_OUT ?= soak-out
SOAK_TIMEOUT ?= 3h
soak: SHELL := /bin/bash
soak:
	@command -v gnuplot >/dev/null || (apt-get update -qq && apt-get install -y -qq gnuplot-nox)
	mkdir -p $(SOAK_OUT)
	SLUICE_SOAK_DURATION=$(DURATION) SLUICE_SOAK_OUT=$(abspath $(SOAK_OUT)) \
		go test -tags faults -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' ./test/faults/ 2>&1 | tee $(SOAK_OUT)/soak.log; \
	status=$${PIPESTATUS[0]}; \
	if [ -s $(SOAK_OUT)/soak.csv ]; then bash test/soakplot.sh $(SOAK_OUT)/soak.csv $(SOAK_OUT)/soak-faults.csv $(SOAK_OUT)/soak.png; fi; \
	exit $$status

# Side by side with ghz: a 3-node cluster from this tree, and a peer cluster
# started by hand when PEER_ADDR, PEER_PIDS and PEER_PROTO are set (see the
# head of test/compare.sh). COMPARE_SECS per round; a few minutes in all.
COMPARE_SECS ?= 10
compare:
	bash test/compare.sh $(COMPARE_SECS)

# One hot key through three nodes with a CPU budget each (cgroup v1, root),
# leases on (the default threshold), then off (docs/leases.md).
HOTKEY_SECS ?= 10
hotkey:
	bash test/hotkey.sh $(HOTKEY_SECS)
	HOTKEY_THRESHOLD=0 bash test/hotkey.sh $(HOTKEY_SECS)

# SCALE_NODES real nodes on this machine's loopback (test/scale.sh): the
# time until every node sees all alive, then SCALE_SECS idle: CPU and RSS
# per node, members declared dead and pauses (it fails on any). Environment
# knobs (SCALE_STAGGER, SCALE_LOAD_RATE, ...) at the head of the script.
# Then the capacity curve (make capacity).
SCALE_NODES ?= 100
SCALE_SECS ?= 300
scale:
	bash test/scale.sh $(SCALE_NODES) $(SCALE_SECS)
	bash test/capacity.sh $(CAPACITY_SECS)

# Checks/s at saturation against nodes (test/capacity.sh): 1, 2, 4 and 8
# nodes held to 0.2 core each by cgroup v1 quotas (root), owner-aware and
# sidecar-style batched load, the servers' CPU per check and the
# generator's CPU; CAP_* knobs at the head of the script.
CAPACITY_SECS ?= 10
capacity:
	bash test/capacity.sh $(CAPACITY_SECS)

# A rolling deploy of DEPLOY_NODES real nodes on this machine's loopback
# (TestRollingDeployAtScale in test/deploy_test.go; go test ./test/ skips
# it): an outside load over every node, 25 nodes restarted gracefully one
# after another, then 25 in bursts of 5; 0 over, 0 lost, 0 call errors,
# each phase's p50/p99/max latency logged. Knobs (SLUICE_DEPLOY_GATE,
# SLUICE_DEPLOY_LOGS, ...) at the head of the test.
DEPLOY_NODES ?= 100
deploy-scale:
	SLUICE_DEPLOY_NODES=$(DEPLOY_NODES) go test -count=1 -v -timeout 30m -run '^TestRollingDeployAtScale$$' ./test/

# SIM_NODES cluster.Nodes in one process on the simulated clock of
# cluster/clustertest (TestThousandMembers; go test runs the same scenario
# at 50 members as TestFiftyMembers): formation, 4 joins and 4 graceful
# leaves under checks (exact counts asserted), 3 crashes (the crash bound
# of docs/guarantees.md); prints what each event moves against 1/N and
# how long the rings took to agree. At 1000: about 14 minutes and 15 GB
# here, 5 minutes with the default ring (docs/scaling.md); SIM_MEMLIMIT is the Go heap's soft limit.
# SIM_PARTITIONS and SIM_LOAD are the ring's --ring-partitions and
# --ring-load: by default what docs/scaling.md gives past 500 nodes
# (SIM_PARTITIONS=7919 SIM_LOAD=1.05 runs the defaults).
SIM_NODES ?= 1000
SIM_MEMLIMIT ?= 14GiB
SIM_PARTITIONS ?= 65521
SIM_LOAD ?= 1.25
sim-scale:
	SLUICE_SIM_NODES=$(SIM_NODES) SLUICE_SIM_PARTITIONS=$(SIM_PARTITIONS) SLUICE_SIM_LOAD=$(SIM_LOAD) GOMEMLIMIT=$(SIM_MEMLIMIT) go test -count=1 -v -timeout 60m -run '^TestThousandMembers$$' ./cluster/clustertest/

# Membership changes under concurrent checks, in cluster/clustertest at
# depth: SIM_LOAD_SEEDS runs of two joins and two graceful leaves under 8
# callers (TestMembershipChangesUnderConcurrentChecks); a failure prints
# the two answers that decided from the same count and the nodes' debug
# log of the key. docs/testing.md states its time and what it finds.
SIM_LOAD_SEEDS ?= 3000
sim-load:
	bash -o pipefail -c "go test -count=1 -v -timeout 0 -run '^TestMembershipChangesUnderConcurrentChecks$$' ./cluster/clustertest/ -underload-seeds $(SIM_LOAD_SEEDS) -underload-trace 2>&1 | grep -v -E '^ *(=== (RUN|PAUSE|CONT|NAME)|--- PASS)|: seed [0-9]+: '"

# The model of cluster/clustertest at depth: SIM_SEEDS random runs of
# joins, leaves, crashes, restarts, partitions and checks, each held to
# docs/guarantees.md's bounds (go test runs 1000; docs/testing.md states
# the time of 100,000). A failure prints its seed and the run.
SIM_SEEDS ?= 100000
SIM_FROM ?= 1
sim-deep:
	bash -o pipefail -c "go test -count=1 -v -timeout 0 -run '^TestModel$$' ./cluster/clustertest/ -runs $(SIM_SEEDS) -from $(SIM_FROM) 2>&1 | grep -v -E '^ *(=== (RUN|PAUSE|CONT)|--- PASS)'"
