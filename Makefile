# Tool versions are pinned here and installed by `make tools`.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
STATICCHECK_VERSION        := v0.8.2
GOBIN ?= $(shell go env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: all build test race lint generate check-generate tools bench fuzz tidy-check

all: build lint test

build:
	go build ./...

test:
	go test ./...

race:
	go test -race ./bucket/... ./ring/... ./writeback/... ./transport/... ./cluster/...

tools:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
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
	staticcheck ./...

tidy-check:
	go mod tidy -diff

bench:
	go test -run '^$$' -bench . -benchmem ./bucket/... ./ring/... ./writeback/... ./cluster/... ./transport/...

fuzz:
	go test -run '^$$' -fuzz FuzzStateDecode -fuzztime 30s ./bucket/
	go test -run '^$$' -fuzz FuzzHashIsXXH64 -fuzztime 30s ./ring/
