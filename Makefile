# Everything runs against real servers in locally built images (no registry is needed).
export TESTCONTAINERS_RYUK_DISABLED ?= true

GO ?= go

.PHONY: all deps deps-missing images demo playground test unit lint fuzz bench-cost bench-throughput

all: lint test

deps: ## install Valkey 8, Redis 7.0, valgrind and Chromium from Debian's packages
	bash scripts/install-deps.sh

# demo and test install what is missing themselves: a newcomer types two commands, not three.
deps-missing:
	@bash scripts/install-deps.sh --if-missing

images: deps-missing ## build rlfn/valkey:8.0 and rlfn/redis:7.0 from the installed servers
	bash scripts/build-images.sh

demo: images ## a throwaway Valkey, the library loaded, every algorithm called
	bash scripts/demo.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...

unit: ## every test that needs no server, in seconds (those that need one skip under -short)
	$(GO) test -short -count=1 ./...

playground: images ## a throwaway Valkey, the library loaded, and the playground page until Ctrl-C
	bash scripts/playground.sh

test: images lint ## every test, against Valkey 8, Redis 7.0 and a Valkey cluster
	@# -p 1: one package at a time. The chaos and failure tests bound latencies on 2 cores; a
	@# package starting its clusters beside them stalled a healthy shard's call past its deadline.
	$(GO) test -count=1 -p 1 -timeout 20m ./...
	@# The Helm chart's test is a module of its own (Helm's and Kubernetes' dependencies).
	cd deploy/helm && $(GO) test -count=1 ./...

fuzz: images ## explore the argument validation on a real server
	@# a failing fuzz worker exits without cleaning up: remove the harness's containers after
	$(GO) test -run '^$$' -fuzz FuzzArguments -fuzztime 60s ./integration_test/; \
	  rc=$$?; docker rm -f $$(docker ps -aq --filter label=rlfn.harness) >/dev/null 2>&1; exit $$rc

bench-cost: ## server cost per decision against redis_rate (callgrind and INFO commandstats)
	bash scripts/bench-cost.sh

bench-throughput: images ## Allow from 64 goroutines against redis_rate and INCR on one Valkey 8: spread, hot key, shared bucket, attack, and the client alone against a fake server; 6 interleaved runs
	@# no tee: sh has no pipefail, and a failed run must stop the loop
	@out=$$(mktemp); for i in 1 2 3 4 5 6; do \
	  $(GO) test ./bench -run '^$$' -bench 'Throughput$$|HotKey$$|SharedBucket$$|UnderAttack$$|ClientOnly$$' -count 1 -timeout 0 >> $$out || { cat $$out; exit 1; }; done; \
	  cat $$out; echo "results in $$out (go run golang.org/x/perf/cmd/benchstat@latest $$out)"

.PHONY: rls-image rlfn-image chart-images rls-bench

rls-image: ## the Envoy rate limit service's image, FROM scratch with the static binary (rlfn/rlfn-rls:dev)
	bash scripts/build-cmd-image.sh rlfn-rls

rlfn-image: ## the rlfn CLI's image, which the Helm chart's deploy Job runs, FROM scratch with the static binary (rlfn/rlfn:dev)
	bash scripts/build-cmd-image.sh rlfn

chart-images: rls-image rlfn-image ## both images the Helm chart runs, from one work tree: the release the Job deploys is the one the service embeds

rls-bench: images ## rlfn's rate limit service beside envoyproxy/ratelimit (built from the module proxy) and the client in process: decisions/s, p50/p99/p99.9; 3 interleaved runs
	@out=$$(mktemp); for i in 1 2 3; do \
	  $(GO) test ./rls -run '^$$' -bench BenchmarkSideBySide -benchtime 20000x -count 1 -timeout 0 >> $$out || { cat $$out; exit 1; }; done; \
	  grep Benchmark $$out; echo "results in $$out"
