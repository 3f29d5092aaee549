//go:build tools

// Package tools only records which upstream command this module builds.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
