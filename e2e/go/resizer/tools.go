//go:build tools

// Package tools names the upstream commands e2e/build compiles.
package tools

import (
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
)
