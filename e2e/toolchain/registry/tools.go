//go:build tools

// Package tools only records which upstream command this module builds.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
