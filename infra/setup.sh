#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (as root): Debian packages, venv, pip install.
# Prometheus, Alertmanager and PostgreSQL come with --no-install-recommends; no Debian service is
# started (the sandboxes start their own: PostgreSQL for the Temporal cluster, infra/temporal/cluster).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in slurmctld slurmd slurm-client munge openssh-server prometheus prometheus-alertmanager debootstrap \
           chromium-headless-shell postgresql-15 openssl; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  apt-get update -qq
  # Debian starts a package's service on install (slurmctld, munge, ssh): policy-rc.d says no,
  # the sandboxes start their own daemons.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  if ! python3 -m venv .venv 2>/dev/null; then
    # Debian's python3 ships venv separately
    rm -rf .venv
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv .venv
  fi
fi
echo "setup: pip install -e .[dev]"
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
