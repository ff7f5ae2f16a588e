//go:build tools

// Package tools names the helm command e2e/build compiles.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
