// Package test holds Sluice's black-box tests: real `sluice serve`
// processes on 127.0.0.x, driven through the public gRPC API and the CLI.
// Each test builds its own cluster on free ports and tears it down.
package test
