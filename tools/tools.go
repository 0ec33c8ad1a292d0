//go:build tools

// Package tools pins the versions of the developer tools the Makefile runs,
// apart from the project's own dependencies.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
