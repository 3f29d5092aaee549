//go:build tools

// Package tools only records which upstream commands this module builds:
// the container runtime of the e2e cluster's real nodes (e2e/node-up.sh).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
