# Herald: the front door for people. `make help` lists the targets.
SHELL := bash
GO    ?= go
export GOTOOLCHAIN := local

# Pinned code generators, fetched from the Go module proxy into .bin/.
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
BIN := $(CURDIR)/.bin

MODULES  := libs/rv libs/kube libs/proto libs/service libs/stream libs/cacheclient libs/storage libs/watchsession services/ingest services/cache services/fanout services/frontdoor integration integration/manifests
SERVICES := ingest cache fanout frontdoor

.PHONY: help run seed build test test-unit kubeapi conformance e2e e2e-deep e2e-local images manifests bench proto proto-check lint tidy clean storage-check

# Container images: FROM scratch, static binaries built here (nothing is pulled).
IMAGE_REPO ?= herald
IMAGE_TAG  ?= dev
IMAGES     := $(SERVICES) etcd nats-server
IMAGE_DIR  := .herald/images
STATIC     := -trimpath -ldflags='-s -w'
# The container suite is its own module (testcontainers' dependencies stay out
# of `make test`); it is linted with the others.
E2E_MODULE := integration/containers

help: ## Show this help.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## Build every service binary into .herald/bin.
	$(GO) build -o .herald/bin/ $(foreach s,$(SERVICES),./services/$(s)/cmd/$(s)) ./integration/cmd/herald-dev ./integration/cmd/herald-seed

run: build ## Start the whole stack locally (embedded etcd + NATS, every service a process); Ctrl-C stops it.
	.herald/bin/herald-dev --dir .herald --bin-dir .herald/bin

seed: ## Write sample nodes and pods into the running stack's etcd (CHURN=300ms keeps changing them).
	$(GO) run ./integration/cmd/herald-seed $(if $(CHURN),-churn $(CHURN))

test: ## Run every test: unit tests and the end-to-end tests on real etcd, JetStream, gRPC and HTTP (and kube-apiserver for cluster mode).
	@# Cluster mode's tests run a real kube-apiserver: build it (once, cached) before the tests' timeout starts.
	@$(GO) run ./integration/cmd/herald-kube-apiserver >/dev/null
	@# integration's end-to-end packages (e2e, kubeapi) each run a whole stack: one at a time (-p 1), not both on the same cores.
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test $$([ $$m = integration ] && echo -p 1) -count=1 -timeout 20m ./...); done

test-unit: ## Run only the fast tests (no end-to-end stack).
	@set -e; for m in $(filter-out integration,$(MODULES)); do (cd $$m && $(GO) test -count=1 ./...); done

e2e: images ## Run the container suite (testcontainers: etcd x3, NATS x3, every service replicated, faults injected), then e2e-deep.
	cd $(E2E_MODULE) && HERALD_IMAGE_REPO=$(IMAGE_REPO) HERALD_IMAGE_TAG=$(IMAGE_TAG) TESTCONTAINERS_RYUK_DISABLED=true \
		$(GO) test -count=1 -timeout 30m -v $(if $(RUN),-run '$(RUN)') ./...
	$(if $(RUN),,$(MAKE) e2e-deep)

e2e-deep: ## Deep resume at issue 17's scale: 200 watchers resume 50,000 events back at once (12-35 min of both cores; part of `make e2e`).
	cd integration && HERALD_DEEP_EVENTS=50000 $(GO) test -count=1 -timeout 60m -v -run TestDeepResumeIsBounded ./e2e/

kubeapi: ## Run only the side-by-side suite against a real kube-apiserver v1.37.2 (integration/kubeapi; part of `make test`).
	@# Builds kube-apiserver once (cached in ~/.cache/herald) before the tests' timeout starts.
	@$(GO) run ./integration/cmd/herald-kube-apiserver >/dev/null
	cd integration && $(GO) test -count=1 -timeout 30m -v $(if $(RUN),-run '$(RUN)') ./kubeapi/

conformance: ## Kubernetes' own sig-api-machinery [Conformance] tests (k8s.io/kubernetes v1.37.2 e2e) against kube-apiserver, then through Herald in cluster mode; prints the table, fails if Herald fails a test kube-apiserver passes (FOCUS=<regexp> runs fewer; SUITE=wide: sig-api-machinery's other tests and sig-auth's, 13 min more, kept out of CI for its 60-min limit).
	@# Builds the e2e test binary and kube-controller-manager once (cached in ~/.cache/herald, ~11 min of 2 cores the first time), then runs.
	$(GO) run ./integration/cmd/herald-conformance $(if $(SUITE),-suite '$(SUITE)') $(if $(FOCUS),-focus '$(FOCUS)')

e2e-local: ## Run only the in-process end-to-end tests (integration/e2e; part of `make test`).
	cd integration && $(GO) test -count=1 -timeout 20m -v ./e2e/...

images: ## Build FROM-scratch images (each service, etcd, nats-server) from static host-built binaries.
	@rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)/bin
	CGO_ENABLED=0 $(GO) build $(STATIC) -o $(IMAGE_DIR)/bin/ $(foreach s,$(SERVICES),./services/$(s)/cmd/$(s))
	cd deploy/images && GOWORK=off CGO_ENABLED=0 $(GO) build $(STATIC) -o $(CURDIR)/$(IMAGE_DIR)/bin/ ./cmd/etcd github.com/nats-io/nats-server/v2
	@set -e; for i in $(IMAGES); do \
		ctx=$(IMAGE_DIR)/$$i; df=deploy/images/Dockerfile; mkdir -p $$ctx; cp $(IMAGE_DIR)/bin/$$i $$ctx/app; \
		if [ -f deploy/images/$$i/Dockerfile ]; then df=deploy/images/$$i/Dockerfile; mkdir -p $$ctx/data; fi; \
		echo "== $(IMAGE_REPO)/$$i:$(IMAGE_TAG)"; docker build -q --build-arg SERVICE=$$i -t $(IMAGE_REPO)/$$i:$(IMAGE_TAG) -f $$df $$ctx; \
	done

manifests: ## Render every deploy/k8s overlay with kubectl kustomize (the strict test is in `make test`).
	@set -e; for o in deploy/k8s/overlays/*/; do echo "== $$o"; kubectl kustomize $$o >/dev/null; done

bench: ## Run the Go benchmarks, then the load benchmark vs kube-apiserver (writes docs/benchmarks.md; the load step, nine workloads x three rounds, takes ~145 min on 2 cores (60 s of measured writes on the three kubelet-like workloads, 20 s on the broadcasts, 15 s on the three -fleet ones: one RBAC-authorized token for every watcher, writes right after the last watch opens); LOAD_ARGS adds flags, e.g. LOAD_ARGS='-rounds 1 -workloads kubelet-5000x200').
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...); done
	@# The baseline is its own module, outside go.work; the first build takes long, later ones come from Go's cache.
	(cd integration/bench/kubeapiserver && GOWORK=off $(GO) build -o $(CURDIR)/.herald/bin/kube-apiserver .) || \
		{ echo "kube-apiserver baseline could not be built: reported as not measured"; rm -f .herald/bin/kube-apiserver; }
	$(GO) build -o .herald/bin/ ./integration/cmd/herald-load
	.herald/bin/herald-load $$(test -x .herald/bin/kube-apiserver && echo -kube-apiserver $(CURDIR)/.herald/bin/kube-apiserver) -out docs/benchmarks.md $(LOAD_ARGS)

$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

proto: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc ## Regenerate libs/proto from its .proto files (pinned tools).
	cd libs/proto && PATH=$(BIN):$$PATH buf lint && PATH=$(BIN):$$PATH buf generate

proto-check: proto ## Fail if the committed generated code differs from a fresh generation.
	@git diff --exit-code -- libs/proto || { echo "libs/proto is stale: run 'make proto' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- libs/proto)" || { echo "libs/proto has untracked generated files"; git status --porcelain -- libs/proto; exit 1; }

storage-check: ## Check libs/storage's resource table against kube-apiserver v1.37.2's own code (slow: builds k8s.io/kubernetes).
	cd libs/storage/kubecheck && GOWORK=off $(GO) test -count=1 ./...

lint: ## gofmt and go vet over every module.
	@test -z "$$(gofmt -l $(MODULES) $(wildcard $(E2E_MODULE)) deploy)" || { gofmt -l $(MODULES) $(wildcard $(E2E_MODULE)) deploy; echo "gofmt needed"; exit 1; }
	@set -e; for m in $(MODULES) $(wildcard $(E2E_MODULE)); do (cd $$m && $(GO) vet ./...); done

tidy: ## go mod tidy in every module.
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done

clean: ## Remove local state (.herald) and tools (.bin).
	rm -rf .herald .bin
