//go:build tools

// Package tools only records which upstream command this module builds.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
