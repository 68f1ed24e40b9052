# watchsan: the two commands a newcomer runs are `make demo` and `make test`.
GO       ?= go
BIN      := bin/watchsan
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# The version and the commit, for `watchsan version` and watchsan_build_info: Go records no
# vcs.revision in a linked git worktree or with -buildvcs=false (golang/go#58218).
LDFLAGS   = -X github.com/watchsan/watchsan/internal/cli.Version=$(VERSION) -X github.com/watchsan/watchsan/internal/cli.Revision=$(REVISION)

.PHONY: build demo docs test test-node test-node-ha test-short soak scenario cluster-bins vet fmt-check fuzz bench bench-micro image push chart

# A static binary (CGO_ENABLED=0: no libc, runs on any Linux, as in the image).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/watchsan

# The 1.7-1.9 incident, end to end, with an embedded upstream: no cluster needed. The demo is a
# command of its own (cmd/watchsan-demo) so that watchsan does not link what it needs. The build
# says what it does as it goes (hack/build-progress.sh): a first run downloads the modules and
# compiles client-go, minutes on 2 cores, which a bare `go build` shows as a silent hang.
demo:
	@GO=$(GO) hack/build-progress.sh bin/watchsan-demo ./cmd/watchsan-demo
	bin/watchsan-demo

# The flags reference, docs/flags.md, written from the code (TestFlagsReferenceUpToDate fails
# when it drifts).
docs:
	$(GO) generate ./internal/cli
	$(GO) test ./internal/server -run TestMetricsReference -update-metrics-doc

# Builds etcd, kube-apiserver and kubectl from pinned modules into .cache/bin (cached).
cluster-bins:
	hack/cluster-bins.sh

# Every test but the real node's (make test-node), the real-apiserver ones included (they need
# the binaries from cluster-bins; how long it all takes is in CONTRIBUTING.md). Progress as it goes (gotestsum, pinned): each
# package's time as it finishes, then each end-to-end test's, and every failure's output at
# the end. The short soak in the end-to-end tests runs a fixed schedule (TEST_SOAK_SEED; the
# one that once found a 502 bug), so CI is repeatable; `make soak`
# explores random schedules.
TEST_SOAK_SEED ?= 1796067027503847260
GOTESTSUM      ?= $(GO) run gotest.tools/gotestsum@v1.13.0
# ISSUE20_ASSERT=1 (the default; the variable's name is historical) makes the HA scenario's
# targets fail it: no 502, no forced relist where a backend could serve the
# resume point, the controller manager's watch-lists in the rolling restart at most direct's,
# every phase converged within 4 s through watchsan. ISSUE20_ASSERT=0 only logs what would fail
# (issue20Check). TestHAQuietWatchesMove asserts its own always.
ISSUE20_ASSERT ?= 1
test: cluster-bins
	$(GOTESTSUM) --format pkgname -- -race -count=1 -timeout 40m $$($(GO) list ./... | grep -v -e '/test/e2e$$' -e '/test/node$$' -e '/test/cluster/node$$')
	WATCHSAN_SOAK_SEED=$(TEST_SOAK_SEED) WATCHSAN_ISSUE20_ASSERT=$(ISSUE20_ASSERT) $(GOTESTSUM) --format testname -- -race -count=1 -timeout 40m ./test/e2e

# The real node (test/cluster/node and test/node): containerd, runc and the real
# kubelet run deploy/'s sidecar, node-local and HA watchsan from the image `make image` builds,
# follow deploy/README.md's node-local steps as written, and install the Helm chart with
# `helm install` (TestHelmChartNodeLocal: the pod Ready, a watch served through it).
# Needs root on Linux and runc (.ci/run installs it); here a machine that cannot run a node
# fails the tests instead of skipping them (WATCHSAN_REQUIRE_NODE=1). One package at a time
# (-p 1): two kubelets would share the device manager's fixed socket. Without -race: the
# harness is all this runs in-process, and the timings it reports are the kubelet's. About 7
# minutes warm (7 tests, 396 s here with other work on the machine; TestNodeLocalKubelet
# 187 s, TestHAFrontendForReal 75 s).
# `make test-node-ha` runs TestHAFrontendForReal (the HA frontend as two replicas, a rolling
# update, a drain and the apiservers' rolling restart) alone.
test-node: cluster-bins
	WATCHSAN_REQUIRE_NODE=1 $(GOTESTSUM) --format testname -- -p 1 -count=1 -timeout 20m ./test/cluster/node ./test/node

test-node-ha: cluster-bins
	WATCHSAN_REQUIRE_NODE=1 $(GOTESTSUM) --format testname -- -count=1 -timeout 20m -run '^TestHAFrontendForReal$$' ./test/node

# The soak (test/e2e/soak_test.go): three real apiservers, continuous writes, informers in
# JSON, protobuf and CBOR through watchsan, a random schedule of faults for SOAK_DURATION; it
# prints a report and fails on any lost, duplicated or regressing event. SOAK_SEED repeats a
# schedule (the seed of every run is printed). `make test` runs its short version (about a
# minute). SOAK_TIMEOUT must exceed SOAK_DURATION plus a few minutes. The test process runs
# without -race here so it takes less of the CPU the report measures; watchsan itself is always
# built with -race by the e2e tests, and `make test` runs the soak's harness with it.
# SOAK_SHARE=1 is the soak of shared watch feeds: watchsan lends an identity with
# --share-watches, three identical informers per codec re-watch every 10 s so their watches
# join the feeds, and the soak also fails unless clients joined feeds. The fault kinds include
# forced compactions (test/e2e/soak_compact_test.go): the apiservers serve secrets
# from etcd (--watch-cache-sizes=secrets#0), every watch is cut while secrets change and etcd
# is compacted, and the soak fails on a compaction that forced no 410 or on a relist of the
# informer whose feed absorbs; the report gives the 410s by outcome and relists per informer.
SOAK_DURATION ?= 10m
SOAK_SEED     ?=
SOAK_TIMEOUT  ?= 2h
SOAK_REPORT   ?=
SOAK_SHARE    ?=
soak: cluster-bins
	WATCHSAN_SOAK_DURATION=$(SOAK_DURATION) WATCHSAN_SOAK_SEED=$(SOAK_SEED) WATCHSAN_SOAK_REPORT=$(SOAK_REPORT) WATCHSAN_SOAK_SHARE=$(SOAK_SHARE) \
	  $(GO) test -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' ./test/e2e

# The real-components scenario (test/e2e/scenario_test.go): kube-controller-manager,
# kube-scheduler and four hollow nodes against three apiservers with audit logs, through
# watchsan, directly, and through haproxy in TCP mode (when installed), under SIGKILL, SIGSTOP
# and a rolling restart; prints its table (SCENARIO_REPORT=file writes it too). About
# 8 minutes warm. SCENARIO_MODES=watchsan,direct runs only those.
SCENARIO_REPORT ?=
SCENARIO_MODES  ?=
scenario: cluster-bins
	WATCHSAN_SCENARIO=1 WATCHSAN_SCENARIO_REPORT=$(SCENARIO_REPORT) WATCHSAN_SCENARIO_MODES=$(SCENARIO_MODES) \
	  WATCHSAN_ISSUE20_ASSERT=$(ISSUE20_ASSERT) $(GO) test -count=1 -v -timeout 40m -run '^TestScenario$$' ./test/e2e

# Unit tests only: no real apiserver.
test-short:
	$(GO) test -race -count=1 -short ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

FUZZTIME ?= 30s
fuzz:
	@for pkg in ./internal/stream ./internal/fix; do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$pkg | grep ^Fuzz); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# watchsan against direct, a pass-through proxy, a decode/re-encode proxy and haproxy (when
# installed), all in one run: writes docs/bench/README.md, results.json and PNG charts; then the
# fan-out section (10, 100 and 1,000 identical watches on a real kube-apiserver and etcd from
# .cache/bin, direct and through watchsan with and without shared feeds). About 20 minutes on 2
# cores. BENCHFLAGS="-phases fanout" runs the fan-out alone (about 3 minutes) and keeps the
# other sections of docs/bench/results.json. BENCHFLAGS="-short -out /tmp/bench-short" checks the harness in
# seconds; `bin/watchsan-bench profile` takes watchsan's CPU and heap profiles.
BENCHFLAGS ?=
bench: build
	$(GO) build -o bin/watchsan-bench ./cmd/watchsan-bench
	bin/watchsan-bench -watchsan $(BIN) -out docs/bench $(BENCHFLAGS)

# Per-event Go benchmarks of the in-process parts.
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/stream ./internal/fix ./internal/bench

# The container image, without a container engine: static binaries for IMAGE_PLATFORMS, then
# hack/image writes an OCI image layout to bin/image, tagged IMAGE:VERSION (the commit, while
# the repository has no release tag; push it with `crane push bin/image REGISTRY/watchsan:TAG`
# or `skopeo copy oci:bin/image docker://REGISTRY/watchsan:TAG`), and bin/image.tar for
# `docker load`, `kind load image-archive` or `ctr images import` (the first platform), tagged
# IMAGE:VERSION and IMAGE:IMAGE_DEV_TAG, the reference deploy/'s kustomizations name (see
# deploy/README.md, "The image"). The Dockerfile builds the same image where a container engine
# runs.
IMAGE           ?= ghcr.io/watchsan/watchsan
IMAGE_DEV_TAG   ?= dev
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
REVISION        ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image:
	@set -e; for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%%/*}; arch=$${p#*/}; arch=$${arch%%/*}; \
	  echo "go build $$p"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" \
	    -o bin/image-bin/$$os-$$arch/watchsan ./cmd/watchsan; \
	done
	$(GO) run ./hack/image --out bin/image --tarball bin/image.tar --ref $(IMAGE):$(VERSION) --tarball-tag $(IMAGE_DEV_TAG) \
	  --version $(VERSION) --revision $(REVISION) --created $(SOURCE_DATE_EPOCH) \
	  $(foreach p,$(IMAGE_PLATFORMS),--binary $(p)=bin/image-bin/$(word 1,$(subst /, ,$(p)))-$(word 2,$(subst /, ,$(p)))/watchsan)

# Builds the image (as `make image`, both platforms) named for your registry and pushes it there:
#   make push REGISTRY=registry.example.com/team            # -> registry.example.com/team/watchsan:<commit>
#   make push REGISTRY=registry.example.com/team TAG=v1.2.3
# with crane (go-containerregistry, pinned), which logs in with your Docker config
# (~/.docker/config.json: `docker login`, or `go run $(CRANE) auth login REGISTRY`). Then run
# that reference: the Helm chart's image.repository and image.tag, or kustomize's `images:`
# (deploy/README.md, "The image").
REGISTRY ?=
TAG      ?= $(VERSION)
CRANE    ?= github.com/google/go-containerregistry/cmd/crane@v0.22.1
ifneq ($(filter push,$(MAKECMDGOALS)),)
ifeq ($(strip $(REGISTRY)),)
$(error make push needs the registry to push to: make push REGISTRY=registry.example.com/team (the image goes to REGISTRY/watchsan:TAG, TAG the commit unless given))
endif
push: IMAGE = $(REGISTRY)/watchsan
push: VERSION := $(TAG)
endif
push: image
	$(GO) run $(CRANE) push bin/image $(IMAGE):$(TAG)
	@echo "pushed $(IMAGE):$(TAG)"
	@echo "helm:      --set image.repository=$(IMAGE) --set image.tag=$(TAG)"
	@echo "kustomize: images: [{name: ghcr.io/watchsan/watchsan, newName: $(IMAGE), newTag: $(TAG)}]"

# The Helm chart (deploy/helm/watchsan): `helm lint --strict` and `helm template` of both modes,
# with the Helm CLI cluster-bins builds from tools/helm. go test ./deploy (in `make test`)
# also compares its rendering with the kustomize bases' and dry-runs it on a real apiserver.
HELM ?= .cache/bin/current/helm
chart: cluster-bins
	@set -e; for mode in frontend node-local; do \
	  echo "== helm lint/template --set mode=$$mode"; \
	  $(HELM) lint --strict deploy/helm/watchsan --set mode=$$mode; \
	  $(HELM) template watchsan deploy/helm/watchsan --namespace watchsan-system --set mode=$$mode --set namespace.create=true >/dev/null; \
	done
