//go:build tools

// Package tools names runc, the OCI runtime containerd's shim runs, for e2e/build.
package tools

import _ "github.com/opencontainers/runc"
