//go:build tools

// Package tools only records which upstream command this module builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
