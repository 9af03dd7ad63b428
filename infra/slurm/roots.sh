#!/usr/bin/env bash
# Debian roots with newer Slurm releases, built once by debootstrap and reused (like the
# Kubernetes binaries). The host (Debian 12) runs Slurm 22.05; these run beside it under chroot.
#
#   roots.sh build VERSION    build the root for VERSION if missing or stale; prints its path
#   roots.sh path VERSION     print the root's path (built or not)
#   roots.sh versions         the versions this script knows, newest first
#
# VERSION: 24.11 (Debian trixie) or 26.05 (Debian sid). sid moves: when it carries another Slurm
# release than the table says, `build` fails and names what it found (update the table).
# Roots live in ${GPUHEAL_CACHE:-~/.cache/gpuheal}/slurm-roots/SUITE; a stamp records what went in.
set -euo pipefail

CACHE=${GPUHEAL_CACHE:-$HOME/.cache/gpuheal}
ROOTS="$CACHE/slurm-roots"
# What a root holds: Slurm's daemons and clients, slurmrestd with its JWT plugin, munge, and a
# python3 for the sandbox's training job (stdlib only).
PACKAGES=slurmctld,slurmd,slurm-client,munge,slurmrestd,slurm-wlm-jwt-plugin,python3
STAMP_TEXT="gpuheal-root-1 $PACKAGES"

log() { printf 'slurm-roots: %s\n' "$*" >&2; }

suite_of() {
  case "$1" in
    24.11) echo trixie ;;
    26.05) echo sid ;;
    *) log "unknown Slurm version '$1' (known: $(versions | tr '\n' ' '))"; exit 2 ;;
  esac
}

versions() { printf '26.05\n24.11\n'; }

mirror() {
  # The machine's own Debian source (the only registry it reaches).
  local uri
  uri=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

cmd_build() {
  local version=$1 suite root tmp started got
  suite=$(suite_of "$version")
  root="$ROOTS/$suite"
  mkdir -p "$ROOTS"
  # One build of a root at a time (`make test` builds beside its first tests; a second build, by
  # hand or by a fixture, waits for the first, then finds the root built).
  exec 9>"$ROOTS/.$suite.lock"
  flock 9
  if [ -f "$root/.gpuheal-stamp" ] && [ "$(cat "$root/.gpuheal-stamp")" = "$STAMP_TEXT" ]; then
    echo "$root"
    return 0
  fi
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  tmp="$root.building.$$"
  rm -rf "$tmp"
  started=$(date +%s)
  log "building the Slurm $version root ($suite) with debootstrap; about a minute"
  if ! debootstrap --variant=minbase --include="$PACKAGES" "$suite" "$tmp" "$(mirror)" >"$tmp.log" 2>&1; then
    tail -20 "$tmp.log" >&2
    log "debootstrap $suite failed; log in $tmp.log"
    exit 1
  fi
  got=$(chroot "$tmp" /usr/sbin/slurmctld -V | awk '{print $2}')
  case "$got" in
    "$version".*) ;;
    *) log "$suite now carries Slurm $got, not $version: update the table in $0"; exit 1 ;;
  esac
  echo "$STAMP_TEXT" >"$tmp/.gpuheal-stamp"
  if grep -q " $root/" /proc/mounts; then
    # Never rm -rf a root with /dev or /proc bound into it: it would reach the host's.
    log "a stale $root is in use (mounted: stop its sandbox first); the new one waits in $tmp"
    exit 1
  fi
  rm -rf "$root" "$tmp.log"
  mv "$tmp" "$root"
  log "Slurm $got root ready in $(($(date +%s) - started)) s: $root"
  echo "$root"
}

case "${1:-}" in
  build) cmd_build "${2:?version}" ;;
  path) echo "$ROOTS/$(suite_of "${2:?version}")" ;;
  versions) versions ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
