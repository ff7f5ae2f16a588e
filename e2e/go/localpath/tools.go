//go:build tools

// Package tools names what e2e/build compiles from rancher's local-path-provisioner (the peer
// e2e/bench measures beside localvol), so that `go mod tidy` keeps what it needs in go.sum.
package tools

import _ "github.com/rancher/local-path-provisioner"
