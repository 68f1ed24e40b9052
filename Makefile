# watchsan: the two commands a newcomer runs are `make demo` and `make test`.
GO       ?= go
BIN      := bin/watchsan
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/watchsan/watchsan/internal/cli.Version=$(VERSION)

.PHONY: build demo test test-short cluster-bins vet fmt-check fuzz bench bench-micro

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/proxy

# The 1.7-1.9 incident, end to end, with an embedded upstream: no cluster needed.
demo: build
	$(BIN) demo

# Builds etcd, kube-apiserver and kubectl from pinned modules into .cache/bin (cached).
cluster-bins:
	hack/cluster-bins.sh

# Every test, the real-apiserver ones included (they need the binaries from cluster-bins).
test: cluster-bins
	$(GO) test -race -count=1 -timeout 40m ./...

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
# installed), all in one run: writes docs/bench/README.md, results.json and PNG charts. About
# 17 minutes on 2 cores. BENCHFLAGS="-short -out /tmp/bench-short" checks the harness in
# seconds; `bin/watchsan-bench profile` takes watchsan's CPU and heap profiles.
BENCHFLAGS ?=
bench: build
	$(GO) build -o bin/watchsan-bench ./cmd/watchsan-bench
	bin/watchsan-bench -watchsan $(BIN) -out docs/bench $(BENCHFLAGS)

# Per-event Go benchmarks of the in-process parts.
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/stream ./internal/fix ./internal/bench
