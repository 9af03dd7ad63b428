#!/usr/bin/env bash
# Kubernetes sandbox: etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built
# from their Go modules by build.sh) and kwok (stands in for kubelets), all on loopback.
#
#   cluster.sh start     start (or reuse) it; writes $DIR/kubeconfig (admin) and waits until ready
#   cluster.sh stop
#   cluster.sh stop-apiserver / start-apiserver   (tests: an apiserver outage mid-remediation)
#
# GPUHEAL_K8S_DIR (default ./.run/k8s) holds certificates, etcd data, logs and the kubeconfig.
# GPUHEAL_K8S_PORT (default 16443) is the apiserver's port; etcd uses PORT+1 and PORT+2.
# GPUHEAL_KWOK_LOG_LEVEL (default INFO; bench/kube.py: WARN, else kwok logs every lease renewal).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${GPUHEAL_K8S_DIR:-.run/k8s}")
PORT=${GPUHEAL_K8S_PORT:-16443}
ETCD_CLIENT=$((PORT + 1))
ETCD_PEER=$((PORT + 2))
BIN=$("$HERE/build.sh" --print-bin)

log() { printf 'k8s-sandbox: %s\n' "$*" >&2; }
# shellcheck source=SCRIPTDIR/../lib/pids.sh
. "$HERE/../lib/pids.sh"

pid_alive() { [ -s "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

spawn() {
  local name=$1; shift
  setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

binary() {  # the binary `spawn` ran for NAME
  case "$1" in
    etcd | kwok) echo "$BIN/$1" ;;
    *) echo "$BIN/kube-$1" ;;
  esac
}

stop_one() {  # only our process: its binary's name, and this sandbox's DIR on its command line
  local name=$1
  [ -s "$DIR/$name.pid" ] || return 0
  # The binary's name, not its cache path: a process started from an earlier cache (go.mod's
  # version bumped since, another HOME) is still ours to stop.
  pid_stop "k8s-sandbox: $name" "$DIR/$name.pid" 50 "/$(basename "$(binary "$name")") " "$DIR/" || true
}

certs() {
  [ -s "$DIR/pki/apiserver.crt" ] && return 0
  mkdir -p "$DIR/pki"
  local p="$DIR/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=gpuheal-sandbox-ca" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$p/apiserver.key" \
    -out "$p/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default\n' >"$p/san.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -days 3650 -extfile "$p/san.ext" -out "$p/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  # Static tokens for the sandbox's own parts: the admin (tests, set-up), the controller manager
  # and kwok (both cluster-wide, as in a kubeadm cluster's control plane). The gpuheal worker is
  # not among them: it uses a ServiceAccount token with infra/k8s/rbac.yaml's least privilege.
  {
    echo "$(openssl rand -hex 16),gpuheal-admin,gpuheal-admin,system:masters"
    echo "$(openssl rand -hex 16),system:kube-controller-manager,kcm,system:masters"
    echo "$(openssl rand -hex 16),kwok,kwok,system:masters"
  } >"$p/tokens.csv"
  chmod 600 "$p"/*.key "$p/tokens.csv"
}

scheduler_token() {  # sandboxes made before the scheduler joined lack its token
  grep -q ',system:kube-scheduler,' "$DIR/pki/tokens.csv" && return 0
  echo "$(openssl rand -hex 16),system:kube-scheduler,kube-scheduler,system:masters" >>"$DIR/pki/tokens.csv"
  pid_alive apiserver && stop_one apiserver  # it reads the token file at start
  return 0
}

kubeconfig() {  # kubeconfig NAME USER
  local token
  token=$(awk -F, -v u="$2" '$2==u {print $1}' "$DIR/pki/tokens.csv")
  cat >"$DIR/$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $2
  user:
    token: $token
contexts:
- name: sandbox
  context: {cluster: sandbox, user: $2}
current-context: sandbox
KC
  chmod 600 "$DIR/$1"
}

ready() {
  curl -fsS --max-time 2 --cacert "$DIR/pki/ca.crt" "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1
}

# The apiserver's audit log: what every ServiceAccount (the gpuheal worker's) asked of a Node, with
# the request's body (a cordon's annotation names its incident); nothing else. The chaos soak's
# checker reads it (infra/soak): a node cordoned twice by one incident is a read skipped.
audit_policy() {
  cat >"$DIR/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    userGroups: ["system:serviceaccounts"]
    verbs: [patch, update, delete]
    resources: [{group: "", resources: [nodes]}]
  - level: None
POLICY
}

start_apiserver() {
  pid_alive apiserver && return 0
  audit_policy
  spawn apiserver "$BIN/kube-apiserver" \
    --audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/audit.log" --audit-log-maxsize=200 \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT" \
    --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
    --client-ca-file="$DIR/pki/ca.crt" --token-auth-file="$DIR/pki/tokens.csv" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$DIR/pki/sa.pub" \
    --service-account-signing-key-file="$DIR/pki/sa.key" --api-audiences=https://kubernetes.default.svc \
    --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --profiling=false --v=1
  for _ in $(seq 300); do ready && return 0; pid_alive apiserver || break; sleep 0.2; done
  log "kube-apiserver did not become ready; see $DIR/apiserver.log"; tail -20 "$DIR/apiserver.log" >&2; exit 1
}

start() {
  mkdir -p "$DIR"
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ] && [ -x "$BIN/kwok" ] || "$HERE/build.sh"
  certs
  scheduler_token
  kubeconfig kubeconfig gpuheal-admin
  kubeconfig scheduler.kubeconfig system:kube-scheduler
  kubeconfig kcm.kubeconfig system:kube-controller-manager
  kubeconfig kwok.kubeconfig kwok
  if ! pid_alive etcd; then
    spawn etcd "$BIN/etcd" --name sandbox --data-dir "$DIR/etcd" \
      --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
      --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
      --initial-cluster "sandbox=http://127.0.0.1:$ETCD_PEER" --log-level warn
  fi
  start_apiserver
  # The node lifecycle controller marks a Node's pods NotReady once its heartbeats are older than
  # the grace period (an apiserver away a minute: every Node). A kubelet marks them Ready again;
  # kwok never does, so one outage left the inference Deployment 0 ready for good and nothing
  # could be borrowed (issue 37's hour). The grace period outlasts the soak's longest outage (90 s);
  # so a node lost for good reads NotReady only after 5 minutes here (gpuheal reads Ready only where kwok sets it: a new node, a health check).
  if ! pid_alive controller-manager; then
    spawn controller-manager "$BIN/kube-controller-manager" --kubeconfig="$DIR/kcm.kubeconfig" \
      --authentication-kubeconfig="$DIR/kcm.kubeconfig" --authorization-kubeconfig="$DIR/kcm.kubeconfig" \
      --service-account-private-key-file="$DIR/pki/sa.key" --root-ca-file="$DIR/pki/ca.crt" \
      --use-service-account-credentials=false --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 \
      --controllers='*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' --node-monitor-grace-period=300s --v=1
  fi
  if ! pid_alive scheduler; then
    spawn scheduler "$BIN/kube-scheduler" --kubeconfig="$DIR/scheduler.kubeconfig" \
      --authentication-kubeconfig="$DIR/scheduler.kubeconfig" --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
      --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 --v=1
  fi
  if ! pid_alive kwok; then
    spawn kwok "$BIN/kwok" --kubeconfig="$DIR/kwok.kubeconfig" --manage-all-nodes=false \
      --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
      --node-lease-duration-seconds=40 --cidr=10.0.0.1/24 --node-ip=10.0.0.1 --v="${GPUHEAL_KWOK_LOG_LEVEL:-INFO}"
  fi
  log "ready: kube-apiserver https://127.0.0.1:$PORT, KUBECONFIG=$DIR/kubeconfig"
}

stop() {
  local n
  for n in kwok scheduler controller-manager apiserver etcd; do stop_one "$n"; done
  log "stopped ($DIR)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  stop-apiserver) stop_one apiserver ;;
  start-apiserver) start_apiserver ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
