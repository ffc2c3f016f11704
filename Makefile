# Herald: the front door for people. `make help` lists the targets.
SHELL := bash
GO    ?= go
export GOTOOLCHAIN := local

# Pinned code generators, fetched from the Go module proxy into .bin/.
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
BIN := $(CURDIR)/.bin

MODULES  := libs/rv libs/kube libs/proto libs/service services/ingest services/cache services/fanout services/frontdoor integration
SERVICES := ingest cache fanout frontdoor

.PHONY: help run seed build test test-unit e2e bench proto proto-check lint tidy clean

help: ## Show this help.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## Build every service binary into .herald/bin.
	$(GO) build -o .herald/bin/ $(foreach s,$(SERVICES),./services/$(s)/cmd/$(s)) ./integration/cmd/herald-dev ./integration/cmd/herald-seed

run: build ## Start the whole stack locally (embedded etcd + NATS, every service a process); Ctrl-C stops it.
	.herald/bin/herald-dev --dir .herald --bin-dir .herald/bin

seed: ## Write sample nodes and pods into the running stack's etcd (CHURN=300ms keeps changing them).
	$(GO) run ./integration/cmd/herald-seed $(if $(CHURN),-churn $(CHURN))

test: ## Run every test: unit tests and the end-to-end tests on real etcd, JetStream, gRPC and HTTP.
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test -count=1 -timeout 20m ./...); done

test-unit: ## Run only the fast tests (no end-to-end stack).
	@set -e; for m in $(filter-out integration,$(MODULES)); do (cd $$m && $(GO) test -count=1 ./...); done

e2e: ## Run the end-to-end tests only.
	cd integration && $(GO) test -count=1 -timeout 20m -v ./...

bench: ## Run the Go benchmarks.
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...); done

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

lint: ## gofmt and go vet over every module.
	@test -z "$$(gofmt -l $(MODULES))" || { gofmt -l $(MODULES); echo "gofmt needed"; exit 1; }
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

tidy: ## go mod tidy in every module.
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done

clean: ## Remove local state (.herald) and tools (.bin).
	rm -rf .herald .bin
