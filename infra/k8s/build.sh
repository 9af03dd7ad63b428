#!/usr/bin/env bash
# Builds the Kubernetes sandbox's binaries once into a cache directory; later runs reuse them.
#   kube-apiserver, kube-controller-manager,  from k8s.io/kubernetes $K8S_VERSION (go.mod's),
#   kube-scheduler                            stamped with that version (clients see it, not
#                                             v0.0.0-master: Helm's kubeVersion checks use it)
#   etcd                                      go.etcd.io/etcd/server/v3, the version go.mod resolves
#   kwok                                      from sigs.k8s.io/kwok $KWOK_VERSION
#   helm                                      from helm.sh/helm/v3 $HELM_VERSION (the chart's tests)
# Debian's etcd-server (3.4.23) is too old: kube-apiserver disables watch progress requests on
# it and kwok's informers then crawl. Everything arrives through the Go module proxy and apt.
#
#   build.sh              build what is missing (prints progress and the time it took)
#   build.sh --print-bin  print the cache's bin directory
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# k8s.io/kubernetes's version: go.mod is the one place it is written (a require, not a replace).
K8S_VERSION=$(awk '{ f = $1 == "require" ? 2 : 1 } $f == "k8s.io/kubernetes" && $(f + 1) != "=>" { print $(f + 1); exit }' "$HERE/go.mod")
[ -n "$K8S_VERSION" ] || { echo "k8s-build: no k8s.io/kubernetes in $HERE/go.mod" >&2; exit 1; }
KWOK_VERSION=v0.7.0   # kwok and helm are not in go.mod: `go install MODULE@VERSION`, their own builds
HELM_VERSION=v3.22.0
BUILD=2               # bump when what is built (or how) changes: a new cache, built afresh
CACHE=${GPUHEAL_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuheal/k8s-$K8S_VERSION-kwok-$KWOK_VERSION-b$BUILD}
BIN="$CACHE/bin"

if [ "${1:-}" = "--print-bin" ]; then echo "$BIN"; exit 0; fi

log() { printf 'k8s-build: %s\n' "$*" >&2; }

# One build at a time per cache (`make test` builds beside its first tests; a second build, by
# hand or by a fixture, waits for the first, then finds the binaries built).
mkdir -p "$BIN"
exec 9>"$CACHE/.lock"
flock 9

if ! command -v openssl >/dev/null || ! command -v curl >/dev/null; then
  log "installing Debian packages openssl curl"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl curl >/dev/null
fi
command -v go >/dev/null || { log "Go is required to build the sandbox (https://go.dev/doc/install)"; exit 1; }

start=$(date +%s)
built=0
# What `kubectl version`, /version and Helm's .Capabilities.KubeVersion report.
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
VERSION_FLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  VERSION_FLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  VERSION_FLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for target in etcd=go.etcd.io/etcd/server/v3 \
              kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
              kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
              kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler; do
  cmd=${target%%=*} pkg=${target#*=}
  if [ ! -x "$BIN/$cmd" ]; then
    log "building $cmd from $pkg (first time only; kube-* take about 5 minutes each on 2 cores)"
    (cd "$HERE" && GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w$VERSION_FLAGS" -o "$BIN/$cmd.tmp.$$" "$pkg")
    mv "$BIN/$cmd.tmp.$$" "$BIN/$cmd"
    built=1
  fi
done
if [ ! -x "$BIN/kwok" ]; then
  log "building kwok $KWOK_VERSION (first time only)"
  GOBIN="$BIN" GOFLAGS=-mod=mod go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  built=1
fi
if [ ! -x "$BIN/helm" ]; then
  log "building helm $HELM_VERSION (first time only)"
  GOBIN="$BIN" GOFLAGS=-mod=mod go install -trimpath -ldflags='-s -w' "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  built=1
fi
if [ "$built" = 1 ]; then
  log "built in $(( $(date +%s) - start )) s into $BIN"
else
  log "cached in $BIN"
fi
