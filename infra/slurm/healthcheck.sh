#!/usr/bin/env bash
# Slurm HealthCheckProgram that reports to gpuheal instead of draining blindly.
#
# slurm.conf:   HealthCheckProgram=/opt/gpuheal/infra/slurm/healthcheck.sh
#               HealthCheckInterval=60
# Settings come from /etc/gpuheal/healthcheck.env (Slurm runs this with a bare environment):
#   GPUHEAL_WEBHOOK_URL=http://gpuheal-webhook:8088/alertmanager
#   GPUHEAL_WEBHOOK_TOKEN=...        (or the variable already set in the environment)
#   GPUHEAL_EXPECT_GPUS=8
#   GPUHEAL_BIN=/opt/gpuheal/.venv/bin/gpuheal
set -u
ENV_FILE=${GPUHEAL_HEALTHCHECK_ENV:-/etc/gpuheal/healthcheck.env}
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
NODE=${SLURMD_NODENAME:-$(hostname -s)}
exec "${GPUHEAL_BIN:-gpuheal}" healthcheck --node "$NODE" --expect-gpus "${GPUHEAL_EXPECT_GPUS:-0}" \
  ${GPUHEAL_WEBHOOK_URL:+--report-to "$GPUHEAL_WEBHOOK_URL"}
