//go:build tools

// Package tools names the upstream commands e2e/build compiles.
package tools

import (
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
