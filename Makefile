# The single entry for building, testing and checking gpupool.
# `make help` lists the targets.

GO            ?= go
GOLANGCI_LINT := bin/golangci-lint
# go-nvml's cgo headers warn about deprecated NVML calls; the warnings are noise.
export CGO_CFLAGS := -Wno-deprecated-declarations
.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# Every build here compiles as the release does: without local paths
# (-trimpath, so that a commit gives the same binaries in any directory),
# and without gRPC's request tracing (grpcnotrace: nothing here serves it,
# and it links html/template, whose reflection keeps every exported method
# of every type, 27 MB of the device plugin's 59). The tests, the images
# and the Kubernetes components of the e2e tests (make kube) then share
# their compiled packages: a package built with other flags or tags is
# compiled again, and Kubernetes' are most of CI's cold build.
export GOFLAGS := $(strip $(GOFLAGS) -trimpath -tags=grpcnotrace)

# Release binaries are stripped too. The gpupool client goes into users'
# pods, so it is built without cgo and runs on any Linux image;
# gpupool-server needs cgo for NVML, the others are built as it is.
RELEASE_FLAGS := -ldflags='-s -w'
BUILD_CLIENT   = CGO_ENABLED=0 $(GO) build $(RELEASE_FLAGS) -o bin/ ./cmd/gpupool
COMMANDS = $(shell $(GO) list ./cmd/...)

.PHONY: build
build: ## build the stripped release binaries into bin/ and print their sizes
	$(BUILD_CLIENT)
	$(GO) build $(RELEASE_FLAGS) -o bin/ $(filter-out %/cmd/gpupool,$(COMMANDS))
	@cd bin && stat -c '%s %n' $(notdir $(COMMANDS)) | awk '{ printf "  bin/%-22s %5.1f MB\n", $$2, $$1 / 1e6 }'

# The images' tag; deploy/'s kustomizations name the same (a test checks).
VERSION := $(shell cat VERSION)
# Every command but the client, which has an image of its own, and the
# demo: a new cmd/ is in gpupool/gpupool without a change here.
SERVER_COMMANDS = $(filter-out %/cmd/gpupool %/cmd/gpupool-demo,$(COMMANDS))
# Only gpupool-server needs cgo (go-nvml); the image's others are static,
# but gpupool-kube-scheduler: a module of its own, it is built as the
# Kubernetes components the end-to-end tests start (its build.sh), from the
# same compiled packages, so that CI compiles Kubernetes once.
CGO_COMMANDS    = %/cmd/gpupool-server
IMAGE_DIR      := bin/image

# The Dockerfile builds its binaries with this too.
.PHONY: image-binaries
image-binaries: ## the binaries of the images into bin/image/bin: the client and every server-side one with gpupool-kube-scheduler, static but gpupool-server and gpupool-kube-scheduler
	rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)/bin
	CGO_ENABLED=0 $(GO) build $(RELEASE_FLAGS) -o $(IMAGE_DIR)/bin/ ./cmd/gpupool $(filter-out $(CGO_COMMANDS),$(SERVER_COMMANDS))
	$(GO) build $(RELEASE_FLAGS) -o $(IMAGE_DIR)/bin/ $(filter $(CGO_COMMANDS),$(SERVER_COMMANDS))
	cmd/gpupool-kube-scheduler/build.sh $(IMAGE_DIR)/bin

# IMAGE_REGISTRY=registry.example.com/team also pushes them there, with the
# credentials of ~/.docker/config.json.
.PHONY: image
image: image-binaries ## the images gpupool/gpupool and gpupool/gpupool-client, tagged with VERSION, into bin/image/gpupool-images.tar, without Docker (IMAGE_REGISTRY=host/path pushes them)
	$(GO) run ./deploy/image -version $(VERSION) -bin $(IMAGE_DIR)/bin -out $(IMAGE_DIR)/gpupool-images.tar $(if $(IMAGE_REGISTRY),-registry $(IMAGE_REGISTRY))

# The commit, not the working tree: two clones of HEAD at two paths (about
# 4 minutes warm on 2 cores). They share the build cache, which Go keys by
# content; `make verify-image VERIFY_IMAGE_GOCACHE=$$(mktemp -d)` builds the
# second from scratch too (about 11 minutes more).
.PHONY: verify-image
VERIFY_IMAGE_GOCACHE ?= $(shell $(GO) env GOCACHE)
verify-image: ## build the images twice from clean clones of HEAD in other directories, and fail if a digest differs
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	git clone -q . "$$dir/a" && git clone -q . "$$dir/b" && \
	$(MAKE) -s -C "$$dir/a" image | grep sha256: > "$$dir/a.txt" && \
	GOCACHE="$(VERIFY_IMAGE_GOCACHE)" $(MAKE) -s -C "$$dir/b" image | grep sha256: > "$$dir/b.txt" && \
	diff "$$dir/a.txt" "$$dir/b.txt" && cat "$$dir/a.txt"

# DEMO_FLAGS=--duration=0 runs the demo until Ctrl-C.
DEMO_FLAGS ?= --duration=60s

# The demo runs as a job of its own (set -m): a terminal's Ctrl-C then
# reaches the demo alone, which stops cleanly, and not make, which would
# end with status 130 whatever the demo did.
.PHONY: demo
demo: ## the whole pool on this machine for 60s (allocator, simulated GPU servers, workload; Ctrl-C stops early)
	@echo "building the demo and the gpupool client into bin/ (about 12 minutes the first time on 2 cores, seconds after) ..."
	@CGO_ENABLED=0 tools/build-progress.sh bin/ ./cmd/gpupool $(RELEASE_FLAGS)
	@tools/build-progress.sh bin/ ./cmd/gpupool-demo $(RELEASE_FLAGS)
	@set -m 2>/dev/null; bin/gpupool-demo $(DEMO_FLAGS)

# The soak's settings, each overridable (SOAK_DURATION=5m make soak);
# SOAK_OUT gets soak.csv, soak.png and verdicts.md.
SOAK_DURATION      ?= 1h
SOAK_EVERY         ?= 1m
SOAK_BASELINE      ?= 10m
SOAK_RESTART_EVERY ?= 3m
SOAK_OUT           ?= $(CURDIR)/bin/soak

# Not in CI: it runs an hour. The binaries are built with the release's
# flags (GOFLAGS above) but unstripped, which maps nothing more into
# memory: their memory is what a deployment's is.
.PHONY: soak
soak: ## the demo-sized pool as real binaries for an hour under churn (a lease a second, a GPU server restarted every 3 minutes, the adapter queried 10 times a second); samples memory and goroutines each minute into bin/soak and fails where they grow
	SOAK_DURATION=$(SOAK_DURATION) SOAK_EVERY=$(SOAK_EVERY) SOAK_BASELINE=$(SOAK_BASELINE) SOAK_RESTART_EVERY=$(SOAK_RESTART_EVERY) \
		SOAK_OUT=$(SOAK_OUT) $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 0 ./test/e2e

.PHONY: simulate
simulate: ## replay the embedded OpenB trace against every placement policy
	$(GO) run ./cmd/gpupool-simulate

# Fails while the pool's default policy (fgd-cpu) leaves more GPU share
# unallocated than FGD on some variant; decisions/s below 100k are reported.
.PHONY: robustness
robustness: ## replay a grid of workload variants of the default OpenB trace (model constraints, fractional, multi-GPU, CPU) with fgd-cpu and fgd over seeds 42-51 and 1042-1051; fails where fgd-cpu does worse
	$(GO) run ./cmd/gpupool-simulate grid

# Debian packages the tests run for real: promtool checks the metrics and
# the rules, etcd backs the replicated allocator and the Kubernetes control
# plane, Prometheus and VictoriaMetrics answer the adapter's PromQL,
# Alertmanager delivers the alerts, containerd, runc and the CNI plugins
# run the pods of the e2e tests' kubelet node, Chromium opens the console.
DEBIAN_PACKAGES := prometheus etcd-server victoria-metrics prometheus-alertmanager \
	containerd runc containernetworking-plugins chromium

.PHONY: deps
deps: ## install the Debian packages the tests use (prometheus, etcd-server, victoria-metrics, prometheus-alertmanager, containerd, runc, containernetworking-plugins, chromium) if missing
	@command -v promtool >/dev/null && command -v etcd >/dev/null && command -v victoria-metrics >/dev/null \
		&& command -v prometheus-alertmanager >/dev/null && command -v containerd >/dev/null \
		&& command -v runc >/dev/null && test -x /usr/lib/cni/bridge && command -v chromium >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES); }

# Everything but the whole-binary tests, which `make e2e` runs.
UNIT_PACKAGES = $(shell $(GO) list ./... | grep -v /test/e2e)
# The race pass leaves out what runs in one goroutine, where the detector
# can find nothing: deploy/, whose tests render the manifests, the chart
# and the images (kustomize and Helm built with the race detector cost CI
# minutes), and the allocator core, which imports no sync (.golangci.yml)
# and whose replays under the detector cost 90 s; allocator/service's race
# tests run the core from many goroutines.
RACE_PACKAGES = $(filter-out $(shell $(GO) list ./deploy/... ./allocator),$(UNIT_PACKAGES))

.PHONY: test
# go vet's analyzers run in make lint (govet, a superset), and go test
# runs its high-confidence subset. Last, gpupool-kube-scheduler's module's
# tests, which check the profile against the kube-scheduler it pins: they
# compile only packages its binary links, which CI's early make kube
# compiles beside the tests.
test: deps verify ## unit, scenario, property and integration tests (real etcd, Prometheus, VictoriaMetrics); a race pass
	$(GO) test -count=1 $(UNIT_PACKAGES)
	$(GO) test -count=1 -race -short $(RACE_PACKAGES)
	cd cmd/gpupool-kube-scheduler && $(GO) test -count=1 ./...

# The cluster the e2e tests start: kube-apiserver, kube-controller-manager,
# kube-scheduler, the kubelet and kube-proxy (cmd/gpupool-kube-scheduler pins them), kwok,
# CoreDNS and the Kubeflow training operator, built once into
# ~/.cache/gpupool (or $KUBE_BIN_DIR). Lower case, so that make does not
# export it to every recipe. KUBE_EXTRAS names what it builds beyond them
# for every target that calls it, CI's early make kube included: keda
# (KEDA's operator and metrics server, about 7 minutes more cold), which
# TestKEDA* start, and containerd (containerd 2 and its runc shim, for the
# DRA node test: Debian's 1.6 has no CDI).
KUBE_EXTRAS ?= keda containerd
kube_bin_dir = $(shell test/e2e/kube/build.sh $(KUBE_EXTRAS) | tail -n 1)

.PHONY: kube
kube: ## build the Kubernetes control plane, the kubelet, kube-proxy, CoreDNS, the training operator and KEDA for the e2e tests once (about 26 minutes cold)
	test/e2e/kube/build.sh $(KUBE_EXTRAS)

.PHONY: e2e
e2e: deps ## the binaries end to end: gpupool run, crash and etcd failover, the daemon, the demo, the console in a headless Chromium, the HPA and KEDA on a real control plane, bursts of 1,000 pods and scheduler faults at 1,213 nodes, pods on a real kubelet
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -count=1 -timeout 30m ./test/e2e/...

.PHONY: bench
bench: bench-pool bench-cluster ## every benchmark: bench-pool's, then bench-cluster's

# Two halves, so that CI runs the first while the Kubernetes build the
# second needs is still going.
.PHONY: bench-pool
bench-pool: deps ## the benchmarks without a cluster: placement decisions/s per policy, a whole replay timed, durable acquisitions/s over HTTP, a tenant's latency beside a full wait queue and beside 200 console readers, daemon scrape and sampling cost, the simulated GPUs' /proc pass, a scheduler-extender filter at 1,213 nodes
	$(GO) test -run '^$$' -bench . -benchtime 5x ./simulate
	$(GO) test -run '^$$' -bench AcquireRelease -benchtime 4000x ./test/e2e
	$(GO) test -run '^$$' -bench 'TenantBesideAFullQueue|ConsoleBesideTenant/admin/retry-at-once' -benchtime 1x ./allocator/service
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./gpuserver
	$(GO) test -run '^$$' -bench DeviceHoldersScan -benchtime 200x ./collector
	$(GO) test -run '^$$' -bench Filter1213Nodes -benchtime 1000x ./kube/scheduler/extender
	@echo "whole replay, all policies x seeds 42-51, default trace:"
	$(GO) run ./cmd/gpupool-simulate --seeds 42-51 --policies all

# bench-hpa waits most of its 7 minutes on the HPA's sync period and
# Prometheus's scrape interval, whose seconds the tests beside it do not
# move: CI runs it beside make e2e. The rest of bench-cluster measures CPU
# and milliseconds, and runs alone.
.PHONY: bench-cluster
bench-cluster: bench-hpa bench-idle bench-keda bench-scale bench-dra ## the benchmarks on a control plane: bench-hpa's, bench-idle's, bench-keda's, bench-scale's, then bench-dra's

.PHONY: bench-hpa
bench-hpa: deps ## the HPA's reaction time to a step in GPU load, through the adapter's direct backend and through Prometheus (about 7 minutes, most of it waiting on their clocks)
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench HPAReaction -benchtime 1x -timeout 20m ./test/e2e

.PHONY: bench-idle
bench-idle: deps ## idle GPUs reclaimed: 200 workloads' use timelines on kwok nodes, the idle policy reporting beside reclaiming: idle-held GPU-hours, GPUs back, false reclaims, resumes, the allocator's CPU (about 9 minutes)
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench IdleReclaim -benchtime 1x -timeout 20m ./test/e2e

.PHONY: bench-keda
bench-keda: deps ## the real KEDA on gpupool's external scaler (polled, pushing) beside its prometheus trigger through Prometheus: load step to replicas, demand to the first GPU, idle to zero, GetMetrics at 200/s (about 20 minutes, most of it waiting on their clocks)
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench KEDA -benchtime 1x -timeout 40m ./test/e2e

.PHONY: bench-scale
bench-scale: deps ## adapter latency through kube-apiserver, kwok at 1,213 nodes, the OpenB workload placed through Kubernetes at 100 pods/s beside the stock kube-scheduler
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench 'AdapterThroughAPIServer|KubeScale' -benchtime 1x -timeout 40m ./test/e2e
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench KwokScale -benchtime 1x ./test/e2e/kube

# Not in CI (about 12 minutes): the claims' path is in make e2e's TestDRA
# tests on every landing.
.PHONY: bench-dra
bench-dra: deps ## the OpenB workload as ResourceClaims at 1,213 kwok nodes, 100 pods/s asked: the pool beside the stock kube-scheduler's DynamicResources on the same slices: GPU share unallocated against the replays of fgd-cpu and first-fit, claims bound a second, p99, CPU a pod by component
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench DRAScale -benchtime 1x -timeout 40m ./test/e2e

# Not in CI, which runs one rate in make bench: three rates, each placed
# through the pool and through the stock kube-scheduler (about 35 minutes).
.PHONY: bench-kube
bench-kube: deps ## the OpenB workload through Kubernetes at 40, 100 and 200 pods/s asked, the pool beside the stock kube-scheduler: throughput, latency, CPU and memory by component, GPU share unallocated against the replay
	KUBE_BIN_DIR=$(kube_bin_dir) $(GO) test -run '^$$' -bench KubeScale -benchtime 1x -timeout 60m ./test/e2e -kubescale.rates 40,100,200

.PHONY: scale
scale: ## gpupool-load at 1,000 GPU servers (8,000 GPUs) and 10,000 leases against the allocator and the adapter: heartbeat, acquisition and adapter p99, /metrics size, the allocator's CPU and RSS (about 4 minutes; GPUPOOL_SCALE_DURATION sets the load's length)
	$(GO) test -count=1 -run '^$$' -bench ThousandServers -benchtime 1x -timeout 20m ./test/e2e

.PHONY: fuzz
fuzz: ## fuzz the pool's operation stream, server registration, request and process-report decoding, leases on the wire, quantity parsing, the extender's node names and KEDA triggers' metadata (60s each)
	$(GO) test ./allocator -run '^$$' -fuzz FuzzPool -fuzztime 60s
	$(GO) test ./allocator/api -run '^$$' -fuzz FuzzRegisterServer -fuzztime 60s
	$(GO) test ./allocator/api -run '^$$' -fuzz FuzzAcquireRequest -fuzztime 60s
	$(GO) test ./allocator/api -run '^$$' -fuzz FuzzLeaseWire -fuzztime 60s
	$(GO) test ./allocator/api -run '^$$' -fuzz FuzzParseGPUMemory -fuzztime 60s
	$(GO) test ./gpuserver -run '^$$' -fuzz FuzzProcessReport -fuzztime 60s
	$(GO) test ./kube/scheduler/extender -run '^$$' -fuzz FuzzNodeNames -fuzztime 60s
	$(GO) test ./adapter/kedascaler -run '^$$' -fuzz FuzzParseTrigger -fuzztime 60s

.PHONY: rewrite
rewrite: ## rewrite the scenario files' expected output (read the diff!)
	$(GO) test ./allocator -run TestScenarios -rewrite

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint with the project's policy (.golangci.yml)
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT): tools/go.mod
	cd tools && $(GO) build -o ../$(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: verify
verify: ## gofmt clean, go.mod tidy (gpupool-kube-scheduler's module's too)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) mod tidy -diff
	cd cmd/gpupool-kube-scheduler && $(GO) mod tidy -diff

.PHONY: verify-generated
verify-generated: ## fail when the committed dashboards or the PrometheusRule differ from what their generators write
	$(GO) run ./dashboards/gen -check
	$(GO) run ./deploy/gen -check

# KEDA's external scaler API (adapter/externalscaler, docs/design.md "KEDA's
# API generated here"): protoc is Debian's protobuf-compiler; the plugins are
# built into bin/, protoc-gen-go at go.mod's google.golang.org/protobuf, so
# that the generated code matches the runtime it links, and
# protoc-gen-go-grpc at the version below (its code needs gRPC 1.64 or later).
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

.PHONY: generate-scaler
generate-scaler: ## regenerate KEDA's external scaler API (adapter/externalscaler) from its .proto (needs protoc: apt-get install protobuf-compiler)
	GOBIN=$(abspath bin) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$$($(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
	GOBIN=$(abspath bin) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	cd adapter/externalscaler && protoc --plugin=protoc-gen-go=../../bin/protoc-gen-go --plugin=protoc-gen-go-grpc=../../bin/protoc-gen-go-grpc \
		--go_out=. --go_opt=paths=source_relative --go_opt=Mexternalscaler.proto=github.com/gpupool/gpupool/adapter/externalscaler \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative --go-grpc_opt=Mexternalscaler.proto=github.com/gpupool/gpupool/adapter/externalscaler \
		externalscaler.proto

.PHONY: clean
clean: ## remove build outputs
	rm -rf bin/
