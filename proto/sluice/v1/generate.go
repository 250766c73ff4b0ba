// Package sluicev1 is the generated Go code of sluice/v1/sluice.proto: the
// public RateLimiter and Admin services and the internal Peer service.
// Regenerate with `make generate` or `go generate ./proto/...` (protoc
// 3.21.12, protoc-gen-go v1.36.12, protoc-gen-go-grpc v1.6.0).
package sluicev1

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative --go-grpc_out=../.. --go-grpc_opt=paths=source_relative sluice/v1/sluice.proto
