#!/usr/bin/env bash
# Certificates for the Temporal cluster's mTLS, made with Debian's openssl (no downloads):
#
#   certs.sh DIR [CLIENT...]   make what is missing in DIR:
#     ca.pem, ca.key                  the cluster's CA (10 years; its key never leaves DIR)
#     server.pem, server.key          the server's certificate (127.0.0.1 and localhost), used for
#                                     the frontend and between the services (serverAuth+clientAuth)
#     CLIENT.pem, CLIENT.key          one client certificate per name (default: gpuheal), CN=CLIENT
#
# Keys are 0600, the directory 0700. Certificates last a year and are not renewed (a sandbox's;
# `cluster.sh start --fresh` after deleting DIR makes new ones). A production cluster brings its
# own PKI (cert-manager, a vault) and an authorizer; this is the sandbox's and the tests'.
set -euo pipefail

DIR=${1:?usage: certs.sh DIR [CLIENT...]}
shift
CLIENTS=("${@:-gpuheal}")
umask 077
mkdir -p "$DIR"
chmod 700 "$DIR"
log() { printf 'temporal-certs: %s\n' "$*" >&2; }

# openssl, its chatter kept in DIR/openssl.log and shown when it fails
ssl() { openssl "$@" 2>>"$DIR/openssl.log" || { log "openssl $1 failed:"; tail -5 "$DIR/openssl.log" >&2; exit 1; }; }

valid_name() { [[ "$1" =~ ^[a-z][a-z0-9-]{0,62}$ ]] || { log "invalid client name: '$1'"; exit 2; }; }

if [ ! -s "$DIR/ca.pem" ]; then
  # A new CA: whatever the one before signed is worthless here, and made again below.
  find "$DIR" -maxdepth 1 -type f ! -name openssl.log -delete
  ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/O=gpuheal sandbox/CN=gpuheal temporal CA" -keyout "$DIR/ca.key" -out "$DIR/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  log "CA made in $DIR"
fi

# sign NAME CN EXTENSIONS: a P-256 key and a certificate from the CA, valid one year
sign() {
  local name=$1 cn=$2 ext=$3
  ssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/O=gpuheal sandbox/CN=$cn" \
    -keyout "$DIR/$name.key" -out "$DIR/$name.csr"
  printf '%s\n' "$ext" >"$DIR/$name.ext"
  ssl x509 -req -in "$DIR/$name.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial -days 365 \
    -extfile "$DIR/$name.ext" -out "$DIR/$name.pem"
  rm -f "$DIR/$name.csr" "$DIR/$name.ext"
}

if [ ! -s "$DIR/server.pem" ]; then
  sign server "temporal frontend" "$(printf '%s\n' \
    "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth,clientAuth" \
    "keyUsage=critical,digitalSignature" "basicConstraints=CA:FALSE")"
  log "server certificate made (127.0.0.1, localhost)"
fi
for client in "${CLIENTS[@]}"; do
  valid_name "$client"
  [ -s "$DIR/$client.pem" ] && continue
  sign "$client" "$client" "$(printf '%s\n' "extendedKeyUsage=clientAuth" \
    "keyUsage=critical,digitalSignature" "basicConstraints=CA:FALSE")"
  log "client certificate made: $client"
done
chmod 600 "$DIR"/*.key
