//go:build tools

// Package tools pins the Temporal server that the production-topology tests run (see build.sh):
// temporal-server (frontend, history, matching and worker services in one process) and
// temporal-sql-tool (creates and migrates its PostgreSQL schemas; the schemas are embedded).
// The project's own code is Python; this module exists only to build those two binaries from
// go.temporal.io/server through the Go module proxy.
package tools

import (
	_ "go.temporal.io/server/cmd/server"
	_ "go.temporal.io/server/cmd/tools/sql"
)
