#!/usr/bin/env bash
# Slurm sandbox: one slurmctld and one slurmd per node, all on loopback.
#
#   sandbox.sh start [--clean]    start (or reuse) the cluster; --clean wipes its state first
#   sandbox.sh stop               stop every daemon of this sandbox (and its jobs)
#   sandbox.sh status             print sinfo; exit 1 when slurmctld does not answer
#   sandbox.sh start-node NAME    start NAME's slurmd (a spare joins, a repaired node returns)
#   sandbox.sh stop-node NAME     stop NAME's slurmd (a node dies or leaves)
#   sandbox.sh start-rest         start slurmrestd (JWT) on 127.0.0.1:PORT+3 (roots only)
#   sandbox.sh token [SECONDS]    write a JWT for root to DIR/rest.token (roots only)
#   sandbox.sh run CMD [ARGS]     run a Slurm command against this sandbox
#   sandbox.sh env                print the SLURM_CONF line for clients
#
# Everything lives in GPUHEAL_SLURM_DIR (default ./.run/slurm); /etc/slurm is never touched.
# GPUHEAL_SLURM_PORT (default 16817) is slurmctld's port; slurmd of node i listens on
# GPUHEAL_SLURM_PORT+100+i, so two sandboxes with different ports can run side by side.
# Nodes gpu01-gpu03 are active; gpu04-gpu06 are spares (State=FUTURE) that a replacement starts.
#
# Slurm versions: the host's Debian 12 Slurm (22.05) by default; with GPUHEAL_SLURM_ROOT set to a
# root from infra/slurm/roots.sh (24.11, 26.05), every daemon and command runs in that root
# under chroot, with /proc, /dev, /sys, this sandbox's directory and the repository (read-only)
# bound into it at the same paths, so paths mean the same inside and out. Each root runs its own
# munged; the last sandbox to stop in a root stops it and unmounts.
set -euo pipefail

DIR=$(realpath -m "${GPUHEAL_SLURM_DIR:-.run/slurm}")
PORT=${GPUHEAL_SLURM_PORT:-16817}
CLUSTER=${GPUHEAL_SLURM_CLUSTER:-sandbox}
ACTIVE=${GPUHEAL_SLURM_ACTIVE:-3}
SPARES=${GPUHEAL_SLURM_SPARES:-3}
INFERENCE=${GPUHEAL_SLURM_INFERENCE:-0}  # inf01..: nodes of an inference pool (FUTURE until borrowed)
# topology.conf's lines, ';'-separated (e.g. "SwitchName=leaf1 Nodes=gpu[01-02];..."): topology/tree
TOPOLOGY=${GPUHEAL_SLURM_TOPOLOGY:-}
FLEET=${GPUHEAL_SLURM_FLEET:-0}  # fleet0001..: defined in slurm.conf, no slurmd (a fleet's size for benchmarks)
# A HealthCheckProgram run every GPUHEAL_SLURM_HEALTHCHECK_INTERVAL s (default none: benchmarks'
# plain-Slurm baseline sets one that drains, as a site's NHC does)
HEALTHCHECK=${GPUHEAL_SLURM_HEALTHCHECK:-}
HEALTHCHECK_INTERVAL=${GPUHEAL_SLURM_HEALTHCHECK_INTERVAL:-60}
# The first job id after a --clean start (a real controller never reuses one; a benchmark that
# restarts its sandbox gives each run its own range)
FIRST_JOB_ID=${GPUHEAL_SLURM_FIRST_JOB_ID:-1}
ROOT=${GPUHEAL_SLURM_ROOT:+$(realpath -m "$GPUHEAL_SLURM_ROOT")}
REPO=$(realpath -m "$(dirname "$0")/../..")
CONF="$DIR/slurm.conf"
PATHS=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF="$CONF"

log() { printf 'slurm-sandbox: %s\n' "$*" >&2; }
# shellcheck source=SCRIPTDIR/../lib/pids.sh
. "$REPO/infra/lib/pids.sh"

valid_node() {
  [[ "$1" =~ ^[A-Za-z][A-Za-z0-9-]{0,62}$ ]] || { log "invalid node name: '$1'"; exit 2; }
}

node_name() { printf 'gpu%02d' "$1"; }

# A Slurm program of this sandbox's version: the host's, or the root's with a clean environment
# (the host's SLURM_CONF and PYTHONPATH must not leak in; its TZ does: the daemons log local time).
slurm() {
  if [ -n "$ROOT" ]; then
    local tz=()
    [ -n "${TZ:-}" ] && tz=("TZ=$TZ")
    # 8>&-: no daemon keeps the root's lock (lock_root) after this script exits.
    chroot "$ROOT" /usr/bin/env -i PATH=$PATHS HOME=/root LANG=C.UTF-8 "${tz[@]}" SLURM_CONF="$CONF" "$@" 8>&-
  else
    "$@"
  fi
}

ensure_packages() {
  [ -n "$ROOT" ] && { [ -x "$ROOT/usr/sbin/slurmctld" ] || { log "no Slurm root at $ROOT (infra/slurm/roots.sh build)"; exit 1; }; return 0; }
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
     || ! command -v munged >/dev/null || ! command -v scontrol >/dev/null; then
    log "installing Debian packages slurmctld slurmd slurm-client munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge >/dev/null
  fi
}

# --- a root: mounts, its munged, who uses it ------------------------------------------------

users_dir() { echo "$ROOT/run/gpuheal-sandboxes"; }

# One sandbox at a time sets up or releases a root several sandboxes share (the tests' and a
# soak's run beside each other): a release must never see another's start half done. Held until
# this script exits; taken once per process. Every program run in the root closes it (slurm()):
# a daemon that inherited it would hold it for as long as it runs, and block every other sandbox.
lock_root() {
  [ -n "${ROOT_LOCKED:-}" ] && return 0
  mkdir -p "$(users_dir)"
  exec 8>"$(users_dir)/.lock"
  flock 8
  ROOT_LOCKED=1
}

in_use() {  # in_use DIR: a sandbox any of whose daemons still runs (its slurmctld may be restarting)
  local f
  for f in "$1"/run/*.pid; do
    [ -e "$f" ] && pid_alive "$f" && return 0
  done
  return 1
}
user_token() { printf '%s' "$DIR" | md5sum | cut -c1-16; }

bind_into_root() {  # bind_into_root HOST_PATH [ro]
  local target="$ROOT$1" tree
  mkdir -p "$target"
  tree=$(stat -c %d:%i -- "$1") || return 1
  if mountpoint -q "$target"; then
    # Reused only if it is this path's tree: a run killed before it stopped leaves its bind of a
    # tree since deleted, and a new tree at the same path (a fresh clone) must not see the old one.
    [ "$tree" = "$(stat -c %d:%i -- "$target")" ] && return 0
    umount -l "$target"
  fi
  mount --bind "$1" "$target"
  [ "${2:-}" = ro ] && mount -o remount,bind,ro "$target" 2>/dev/null || true
}

mount_root() {
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
  mountpoint -q "$ROOT/sys" || mount --bind /sys "$ROOT/sys"
  bind_into_root "$REPO" ro
  mkdir -p "$DIR"
  bind_into_root "$DIR"
  [ -f "$ROOT/etc/hosts" ] || printf '127.0.0.1 localhost\n127.0.0.1 %s\n' "$(hostname)" >"$ROOT/etc/hosts"
  mkdir -p "$(users_dir)"
  echo "$DIR" >"$(users_dir)/$(user_token)"
}

root_pids() {  # processes whose root directory is this root
  local p r
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null) || continue
    [ "$r" = "$ROOT" ] && echo "${p#/proc/}"
  done
  return 0
}

release_root() {
  local m pids=()
  lock_root
  mountpoint -q "$ROOT$DIR" && { umount "$ROOT$DIR" 2>/dev/null || umount -l "$ROOT$DIR"; }
  rm -f "$(users_dir)/$(user_token)"
  local entry other
  for entry in "$(users_dir)"/*; do  # forget sandboxes that went away without stopping
    [ -f "$entry" ] || continue
    other=$(cat "$entry")
    if in_use "$other"; then return 0; fi  # another sandbox still uses the root
    mountpoint -q "$ROOT$other" && { umount "$ROOT$other" 2>/dev/null || umount -l "$ROOT$other"; }
    rm -f "$entry"
  done
  # munged, and anything a job left: processes known by their root directory, not a pid file
  mapfile -t pids < <(root_pids)
  if [ "${#pids[@]}" -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    sleep 0.5
    mapfile -t pids < <(root_pids)
    [ "${#pids[@]}" -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  for m in "$REPO" /sys /dev /proc; do
    mountpoint -q "$ROOT$m" || continue
    for _ in $(seq 20); do umount "$ROOT$m" 2>/dev/null && break; sleep 0.25; done
    mountpoint -q "$ROOT$m" && umount -l "$ROOT$m"
  done
  return 0
}

ensure_munge() {
  if [ -n "$ROOT" ]; then
    [ -s "$ROOT/etc/munge/munge.key" ] || slurm mungekey -c
    mkdir -p "$ROOT/run/munge"
    slurm chown munge:munge /run/munge /etc/munge /etc/munge/munge.key /var/lib/munge /var/log/munge
    slurm munge -n </dev/null >/dev/null 2>&1 && return 0
    slurm runuser -u munge -- /usr/sbin/munged --force
  else
    [ -s /etc/munge/munge.key ] || mungekey -c
    mkdir -p /run/munge
    munge -n </dev/null >/dev/null 2>&1 && return 0
    munged --force
  fi
  for _ in $(seq 50); do slurm munge -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "munged did not start"; exit 1
}

# --- configuration ---------------------------------------------------------------------------

write_conf() {
  local total=$((ACTIVE + SPARES)) first_spare=$((ACTIVE + 1)) i
  mkdir -p "$DIR"/{state,spool,log,run}
  cat >"$CONF" <<CONF
# Generated by infra/slurm/sandbox.sh; edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
MpiDefault=none
MailProg=/bin/true
MaxJobCount=${GPUHEAL_SLURM_MAX_JOBS:-10000}
FirstJobId=$FIRST_JOB_ID
# Every slurmd of the sandbox shares this machine: nodes are what slurm.conf says (4 CPUs each).
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
# Slurm's account of each job that ends (no slurmdbd in the sandbox): the soak's checker reads it.
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdTimeout=${GPUHEAL_SLURMD_TIMEOUT:-300}
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=3600
DebugFlags=NO_CONF_HASH
CONF
  if [ -n "$ROOT" ]; then
    # 24.11 and later: no cgroup filesystem in the sandbox (22.05 refuses this line); slurmrestd's
    # JWTs (the key must be readable by SlurmUser only).
    echo "CgroupPlugin=disabled" >"$DIR/cgroup.conf"
    [ -s "$DIR/jwt.key" ] || dd if=/dev/urandom bs=32 count=1 of="$DIR/jwt.key" status=none
    chmod 0600 "$DIR/jwt.key"
    printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=%s\n' "$DIR/jwt.key" >>"$CONF"
  fi
  # One line per node: each slurmd needs its own port.
  for i in $(seq 1 "$total"); do
    local state=""
    [ "$i" -ge "$first_spare" ] && state=" State=FUTURE"
    echo "NodeName=$(node_name "$i") NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + 100 + i)) CPUs=4 RealMemory=1000$state" >>"$CONF"
  done
  local members
  members="gpu[01-$(printf '%02d' "$total")]"
  for i in $(seq 1 "$INFERENCE"); do
    printf 'NodeName=inf%02d NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=4 RealMemory=1000 Features=inference State=FUTURE\n' \
      "$i" $((PORT + 100 + total + i)) >>"$CONF"
  done
  [ "$INFERENCE" -gt 0 ] && members+=",inf[01-$(printf '%02d' "$INFERENCE")]"
  # The fleet in one line, its ports a range: every Slurm command parses slurm.conf, and 10,000
  # lines of it cost each command about 0.3 s of CPU (a real fleet's config is written in ranges).
  if [ "$FLEET" -gt 0 ]; then
    local base=$((PORT + 100 + total + INFERENCE))
    printf 'NodeName=fleet[0001-%04d] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[%d-%d] CPUs=4 RealMemory=1000\n' \
      "$FLEET" $((base + 1)) $((base + FLEET)) >>"$CONF"
  fi
  [ "$FLEET" -gt 0 ] && members+=",fleet[0001-$(printf '%04d' "$FLEET")]"
  echo "PartitionName=gpu Nodes=$members Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
  if [ -n "$HEALTHCHECK" ]; then
    printf 'HealthCheckProgram=%s\nHealthCheckInterval=%s\n' "$HEALTHCHECK" "$HEALTHCHECK_INTERVAL" >>"$CONF"
  fi
  rm -f "$DIR/topology.conf"
  if [ -n "$TOPOLOGY" ]; then
    echo "TopologyPlugin=topology/tree" >>"$CONF"
    printf '%s\n' "$TOPOLOGY" | tr ';' '\n' >"$DIR/topology.conf"
  fi
}

# --- daemons ---------------------------------------------------------------------------------

# Daemons remove their own pid files as they exit, so every read tolerates a file that just went.
pid_of() { cat "$1" 2>/dev/null || true; }
pid_alive() { local p; p=$(pid_of "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

ctld_up() { slurm scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_node() {
  valid_node "$1"
  local pidf="$DIR/run/slurmd-$1.pid"
  if pid_alive "$pidf"; then return 0; fi
  mkdir -p "$DIR/spool/$1"
  slurm slurmd -N "$1" -f "$CONF"
}

# Every daemon of this sandbox (slurmctld, slurmd, slurmrestd) runs with `-f $CONF` and no other
# sandbox's does: that is how its process is told from one that was given a reused PID.
stop_pidfile() {
  local name
  name=$(basename "$1" .pid)
  pid_stop "slurm-sandbox: $name" "$1" 50 "${name%%-*} " "-f $CONF " || true
}

wait_idle() {
  # Ready means slurmctld answers and every active node has registered.
  local want=$1
  for _ in $(seq 300); do
    local n
    n=$(slurm sinfo -h -N -t idle,mixed,alloc,drain -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$n" -ge "$want" ] && return 0
    sleep 0.1
  done
  log "nodes did not register in 30 s; see $DIR/log"; slurm sinfo -N || true; exit 1
}

cmd_start() {
  local clean=0
  [ "${1:-}" = "--clean" ] && clean=1
  ensure_packages
  [ -n "$ROOT" ] && lock_root
  if [ "$clean" = 1 ]; then cmd_stop; rm -rf "$DIR"; fi
  [ -n "$ROOT" ] && mount_root
  ensure_munge
  if [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid" && ctld_up; then
    log "already running (SLURM_CONF=$CONF)"
  else
    write_conf
    slurm slurmctld -c -f "$CONF"
    for _ in $(seq 100); do ctld_up && break; sleep 0.1; done
    ctld_up || { log "slurmctld did not answer; see $DIR/log/slurmctld.log"; exit 1; }
    local i
    for i in $(seq 1 "$ACTIVE"); do start_node "$(node_name "$i")"; done
  fi
  wait_idle "$ACTIVE"
  log "ready: cluster $CLUSTER, Slurm $(slurm sinfo -V | awk '{print $2}'), slurmctld on 127.0.0.1:$PORT, SLURM_CONF=$CONF"
  slurm sinfo >&2
}

kill_job_steps() {
  # slurmstepd and the jobs under it outlive slurmd; find this sandbox's by their SLURM_CONF.
  local p kid
  for p in $(pgrep -x slurmstepd || true); do
    grep -qzx "SLURM_CONF=$CONF" "/proc/$p/environ" 2>/dev/null || continue
    for kid in $(pgrep -P "$p" || true); do kill -9 -- "-$kid" 2>/dev/null || kill -9 "$kid" 2>/dev/null || true; done
    kill -9 "$p" 2>/dev/null || true
  done
}

kill_forked_daemons() {
  # A slurmd forks to send its epilog-complete message and, the controller gone, retries it for
  # minutes; no pid file names that child. Find this sandbox's by the config on its command line.
  local p
  for p in $(pgrep -x slurmd || true); do
    pid_ours "$p" "-f $CONF " || continue
    kill -9 "$p" 2>/dev/null || true
  done
}

cmd_stop() {
  [ -d "$DIR/run" ] || { [ -n "$ROOT" ] && release_root; return 0; }
  local f
  # (a ping of a controller that is gone waits out Slurm's MessageTimeout: ask only a live one)
  if pid_alive "$DIR/run/slurmctld.pid" && { [ -z "$ROOT" ] || mountpoint -q "$ROOT/proc"; }; then
    ctld_up && slurm scancel --quiet --full --user=root 2>/dev/null || true
  fi
  # Every daemon at once: stopping them one by one takes seconds each.
  for f in "$DIR"/run/*.pid; do [ -e "$f" ] && stop_pidfile "$f" & done
  wait
  kill_job_steps
  kill_forked_daemons
  [ -n "$ROOT" ] && release_root
  log "stopped ($DIR)"
}

cmd_start_rest() {
  [ -n "$ROOT" ] || { log "slurmrestd runs in a root (24.11+): 22.05's REST API cannot update nodes"; exit 2; }
  local pidf="$DIR/run/slurmrestd.pid" port=$((PORT + 3))
  pid_alive "$pidf" && return 0
  # slurmrestd refuses to run as SlurmUser: it drops to nobody (numeric: 26.05 cannot resolve
  # the name); -s openapi/slurmctld because the sandbox has no slurmdbd.
  chroot "$ROOT" /usr/bin/env -i PATH=$PATHS LANG=C.UTF-8 SLURM_CONF="$CONF" SLURM_JWT=daemon \
    slurmrestd -f "$CONF" -a rest_auth/jwt -s openapi/slurmctld -u 65534 -g 65534 "127.0.0.1:$port" \
    >>"$DIR/log/slurmrestd.log" 2>&1 &
  echo $! >"$pidf"
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { log "slurmrestd on http://127.0.0.1:$port"; return 0; }
    sleep 0.1
  done
  log "slurmrestd did not answer; see $DIR/log/slurmrestd.log"; exit 1
}

cmd_token() {
  [ -n "$ROOT" ] || { log "tokens need auth/jwt (a root, 24.11+)"; exit 2; }
  local token
  token=$(slurm scontrol token username=root lifespan="${1:-86400}" | sed -n 's/^SLURM_JWT=//p')
  [ -n "$token" ] || { log "scontrol token gave no token"; exit 1; }
  (umask 077; printf '%s\n' "$token" >"$DIR/rest.token")
  echo "$DIR/rest.token"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) ctld_up && slurm sinfo -N -l ;;
  start-node) start_node "${2:?node name}" ;;
  stop-node) valid_node "${2:?node name}"; stop_pidfile "$DIR/run/slurmd-$2.pid" ;;
  start-rest) cmd_start_rest ;;
  token) cmd_token "${2:-86400}" ;;
  run) shift; slurm "$@" ;;
  env) echo "SLURM_CONF=$CONF" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
