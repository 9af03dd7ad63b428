#!/usr/bin/env bash
# Capture real Slurm JSON into tests/data/slurm/<version>/ for the parsers' unit tests.
#
#   tests/data/slurm/capture.sh 22.05|24.11|26.05
#
# Starts a fresh sandbox of that version on its own port (infra/slurm/sandbox.sh; 24.11 and 26.05
# from infra/slurm/roots.sh), submits the jobs below, captures, and stops it. Re-run when a
# Debian suite moves to another Slurm (the parser tests then say what changed).
set -euo pipefail
VERSION=${1:?version: 22.05, 24.11 or 26.05}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
OUT="$HERE/$VERSION"
export GPUHEAL_SLURM_DIR=/tmp/gpuheal-capture-$VERSION GPUHEAL_SLURM_PORT=44817
if [ "$VERSION" != 22.05 ]; then
  GPUHEAL_SLURM_ROOT=$("$REPO/infra/slurm/roots.sh" build "$VERSION")
  export GPUHEAL_SLURM_ROOT
fi
SB="$REPO/infra/slurm/sandbox.sh"
trap '"$SB" stop' EXIT
"$SB" start --clean
C() { "$SB" run "$@"; }
mkdir -p "$OUT"
cap() { local n=$1; shift; C "$@" >"$OUT/$n.json" 2>/dev/null || true; }
jid() { C sbatch --parsable -o /dev/null "$@" | cut -d';' -f1; }
cap sinfo-empty sinfo --json
J1=$(jid -N1 -w gpu01 -J single --mail-user=ops@example.com --mail-type=END,FAIL --wrap 'sleep 600')
C scontrol update jobid="$J1" comment="gpuheal step=3 ckpt=2 ckpt_at=1700000000 restart=0"
jid --no-requeue -x gpu01 -J noreq --wrap 'sleep 600' >/dev/null
jid -N2 -J twonode --wrap 'sleep 600' >/dev/null
jid -H -J held --wrap 'sleep 600' >/dev/null
sleep 3
cap squeue-jobs squeue --json
cap scontrol-nodes scontrol show nodes --json
C scontrol update nodename=gpu02 state=drain reason="gpuheal-c-gpu02: XID 79"
sleep 1
cap sinfo-drain sinfo --json
C scontrol requeue "$J1"
sleep 1
cap squeue-requeued squeue --json
echo "captured Slurm $(C sinfo -V | awk '{print $2}') into $OUT" >&2
