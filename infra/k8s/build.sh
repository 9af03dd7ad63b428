#!/usr/bin/env bash
# Builds the Kubernetes sandbox's binaries once into a cache directory; later runs reuse them.
#   kube-apiserver, kube-controller-manager  from k8s.io/kubernetes $K8S_VERSION (this module)
#   etcd                                      go.etcd.io/etcd/server/v3, the version go.mod resolves
#   kwok                                      from sigs.k8s.io/kwok $KWOK_VERSION
# Debian's etcd-server (3.4.23) is too old: kube-apiserver disables watch progress requests on
# it and kwok's informers then crawl. Everything arrives through the Go module proxy and apt.
#
#   build.sh              build what is missing (prints progress and the time it took)
#   build.sh --print-bin  print the cache's bin directory
set -euo pipefail

K8S_VERSION=v1.36.3   # keep in step with go.mod
KWOK_VERSION=v0.7.0
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${GPUHEAL_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuheal/k8s-$K8S_VERSION-kwok-$KWOK_VERSION}
BIN="$CACHE/bin"

if [ "${1:-}" = "--print-bin" ]; then echo "$BIN"; exit 0; fi

log() { printf 'k8s-build: %s\n' "$*" >&2; }

if ! command -v openssl >/dev/null || ! command -v curl >/dev/null; then
  log "installing Debian packages openssl curl"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl curl >/dev/null
fi
command -v go >/dev/null || { log "Go is required to build the sandbox (https://go.dev/doc/install)"; exit 1; }

mkdir -p "$BIN"
start=$(date +%s)
built=0
for target in etcd=go.etcd.io/etcd/server/v3 \
              kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
              kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager; do
  cmd=${target%%=*} pkg=${target#*=}
  if [ ! -x "$BIN/$cmd" ]; then
    log "building $cmd from $pkg (first time only; kube-* take about 5 minutes each on 2 cores)"
    (cd "$HERE" && GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$BIN/$cmd.tmp" "$pkg")
    mv "$BIN/$cmd.tmp" "$BIN/$cmd"
    built=1
  fi
done
if [ ! -x "$BIN/kwok" ]; then
  log "building kwok $KWOK_VERSION (first time only)"
  GOBIN="$BIN" GOFLAGS=-mod=mod go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  built=1
fi
if [ "$built" = 1 ]; then
  log "built in $(( $(date +%s) - start )) s into $BIN"
else
  log "cached in $BIN"
fi
