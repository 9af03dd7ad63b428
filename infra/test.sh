#!/usr/bin/env bash
# `make test`'s tests. What infra/ builds for the sandbox (the Kubernetes binaries, the Temporal
# cluster's server, the newer Slurm releases' roots: about 20 minutes on a fresh machine, all
# CPU) is built beside the tests that need none of it, which mostly wait on daemons: at the
# lowest priority, so those tests keep the CPU they ask for. Then the tests that need the builds
# run (marked `built`: tests/integration/conftest.py). Built already: seconds.
# Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
mkdir -p .run
log=.run/builds.log
echo "make test: building the sandbox beside the first tests (progress: $log)"
setsid nice -n 19 bash -ec '
  bash infra/k8s/build.sh
  bash infra/temporal/cluster/build.sh
  bash infra/slurm/roots.sh build 24.11 >/dev/null
  bash infra/slurm/roots.sh build 26.05 >/dev/null
' >"$log" 2>&1 &
builds=$!
# Stopped (Ctrl-C, a CI cancel) or failed early: no build goes on behind it.
trap 'kill -TERM -- "-$builds" 2>/dev/null' EXIT
trap 'exit 130' INT TERM

outcome() { [ "$1" = 5 ] && echo 0 || echo "$1"; }  # 5: nothing selected (arguments naming one group)
.venv/bin/pytest -m "not built" "$@"
first=$(outcome $?)
case $first in 2 | 3 | 4) exit "$first" ;; esac # interrupted, or pytest itself refused: stop here
if ! wait "$builds"; then
  tail -40 "$log" >&2
  echo "make test: the sandbox's builds failed (all of it: $log)" >&2
  exit 1
fi
cat "$log"
# The five-minute chaos soak (infra/soak: the production topology under a seeded load and seeded
# faults, then its invariants checked from Slurm's and Temporal's records), beside the tests
# that need the builds: it has its own ports and root, and spends its ten minutes or so (a minute
# to start, five of load, up to five for incidents to end) mostly waiting on its daemons, while
# those tests take sixteen. A fixed seed: the same load and faults every run.
# GPUHEAL_TEST_SOAK=0 leaves it out (a run of a few named tests).
soaked=0
soak=""
stop_soak() {  # SIGTERM: the soak cancels itself and stops its world before it exits
  [ -n "$soak" ] || return 0
  kill -TERM -- "-$soak" 2>/dev/null
  wait "$soak" 2>/dev/null
  soak=""
}
if [ "${GPUHEAL_TEST_SOAK:-1}" != 0 ]; then
  echo "make test: the five-minute soak beside the built tests (progress: .run/soak.log)"
  rm -f .run/soak/verdicts.json .run/soak/soak.md  # a soak that fails to start leaves no old verdict
  setsid .venv/bin/python -m infra.soak --minutes 5 --seed "${GPUHEAL_SOAK_SEED:-3}" --root .run/soak \
    >.run/soak.log 2>&1 &
  soak=$!
  trap 'kill -TERM -- "-$builds" 2>/dev/null; stop_soak' EXIT
fi
.venv/bin/pytest -m built "$@"
second=$(outcome $?)
case $second in 2 | 3 | 4) stop_soak; exit "$second" ;; esac
if [ -n "$soak" ]; then
  wait "$soak"
  soaked=$?
  soak=""
  cat .run/soak.log
  if [ "$soaked" = 1 ] && [ -f .run/soak/verdicts.json ]; then  # written only by its checker
    cat .run/soak/soak.md >&2 2>/dev/null
    echo "make test: the soak found invariants broken (its report: .run/soak/soak.md)" >&2
  elif [ "$soaked" != 0 ]; then
    echo "make test: the soak did not finish (exit $soaked; its log above)" >&2
  fi
fi
exit $((first != 0 ? first : second != 0 ? second : soaked))
