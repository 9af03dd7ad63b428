# shellcheck shell=bash
# Processes recorded in pid files, signalled only while they are ours. A pid file alone proves
# nothing: the process may be gone and its PID given to another (the Python side's rule is
# infra/sandbox/processes.py's stop_recorded). Sourced by infra's scripts, each by its path
# from the script's own directory (k8s/cluster.sh: `. "$HERE/../lib/pids.sh"`).
#
#   pid_ours PID PATTERN...       whether PID runs now and its command line (arguments joined by
#                                 spaces, a space after the last) holds every PATTERN (fixed strings)
#   pid_stop WHO PIDFILE TENTHS PATTERN...
#                                 stop PIDFILE's process if it is ours: TERM, wait up to TENTHS
#                                 tenths of a second while it is still ours, then KILL; the pid
#                                 file goes in every case. A PID now run by another process is
#                                 never signalled ("WHO: pid N is no longer ours; left alone ..."
#                                 on stderr). Status 0: ours was stopped; 1: nothing of ours ran.
#
# PATTERN is what the caller can state of its own process: its binary and the config or data path
# of this instance (two sandboxes run the same binaries side by side). Between a spawn's fork and
# its exec the command line is still the shell's: a stop in those few milliseconds finds nothing
# of ours (no caller stops what it has just started without waiting for it to answer first).

pid_ours() {
  local pid=$1 cmdline pattern
  shift
  [[ "$pid" =~ ^[1-9][0-9]*$ ]] || return 1
  # A zombie's or a kernel thread's command line is empty: never ours.
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [ -n "$cmdline" ] || return 1
  for pattern in "$@"; do
    [[ "$cmdline" == *"$pattern"* ]] || return 1
  done
  return 0
}

pid_stop() {
  local who=$1 pidf=$2 tenths=$3 pid
  shift 3
  pid=$(cat "$pidf" 2>/dev/null || true)  # (a daemon may remove its own pid file as it exits)
  [[ "$pid" =~ ^[[:space:]]*([0-9]+)[[:space:]]*$ ]] && pid=${BASH_REMATCH[1]}
  if ! pid_ours "$pid" "$@"; then
    # Alive (a command line: not a zombie) but another's; what it runs is none of our business.
    if [[ "$pid" =~ ^[1-9][0-9]*$ ]] && [ -n "$(tr -d '\0' 2>/dev/null <"/proc/$pid/cmdline")" ]; then
      printf '%s: pid %s is no longer ours; left alone (stale %s removed)\n' "$who" "$pid" "$pidf" >&2
    fi
    rm -f "$pidf"
    return 1
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < tenths; i++)); do
    pid_ours "$pid" "$@" || break
    sleep 0.1
  done
  if pid_ours "$pid" "$@"; then
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do pid_ours "$pid" "$@" || break; sleep 0.05; done
  fi
  rm -f "$pidf"
  return 0
}
