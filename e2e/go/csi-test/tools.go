//go:build tools

// Package tools names csi-sanity, the upstream CSI conformance suite e2e/build compiles.
package tools

import _ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
