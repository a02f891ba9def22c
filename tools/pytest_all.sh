#!/usr/bin/env bash
# Every pytest test, as `make test` runs them, in two phases, so that the suite's long single-core
# stretches do not leave the second core idle:
#   1. every test not named below, one run: the tests that measure rates and deadlines (the chaos test,
#      slowloris, gossip, the devnets) have the machine to themselves;
#   2. two runs side by side, LEFT and RIGHT, each of files whose time is one core of torch (vLLM holds
#      torch to one thread on CPU, see `VllmEngine`: generation, conversion, prefills, GRPO steps) or
#      pure logic (tests/unit), and whose assertions are on computed values, never on time. Both hold
#      torch to one thread (OMP_NUM_THREADS=1): an op split over two threads waits for the slower one,
#      many times slower than one thread when the other core is busy.
# The second run of phase 2 is reported after the first; the exit status fails if any run failed.
# Arguments go to every run (e.g. `tools/pytest_all.sh -x`).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/pytest -q "$@")
LEFT=(
  tests/integration/test_rollout_verify.py
  tests/integration/test_engine.py
  tests/integration/test_eval.py
  tests/adversarial/test_banned_stops.py
  tests/adversarial/test_margin_steering.py
  tests/adversarial/test_swapped_weights.py
)
RIGHT=(
  tests/integration/test_grpo_learns.py
  tests/adversarial/test_trainer_checks.py
  tests/adversarial/test_exact_sampling.py
  tests/unit
)

status() {  # pytest's exit status, where 5 (nothing collected: a filter in "$@" matched nothing) is fine
  local code=$1
  [ "$code" -eq 5 ] && code=0
  echo "$code"
}

ignore=()
for f in "${LEFT[@]}" "${RIGHT[@]}"; do ignore+=("--ignore=$f"); done
echo "== pytest, phase 1 of 2: every other test"
"${PYTEST[@]}" "${ignore[@]}" tests
first=$(status $?)

echo "== pytest, phase 2 of 2: ${LEFT[*]} beside ${RIGHT[*]}"
right_log=$(mktemp "${TMPDIR:-/tmp}/pytest-right.XXXXXX")
OMP_NUM_THREADS=1 "${PYTEST[@]}" "${RIGHT[@]}" >"$right_log" 2>&1 &
right_pid=$!
OMP_NUM_THREADS=1 "${PYTEST[@]}" "${LEFT[@]}"
left=$(status $?)
wait "$right_pid"
right=$(status $?)
echo "== pytest, phase 2 of 2, the run beside: ${RIGHT[*]}"
cat "$right_log"
rm -f "$right_log"

if [ "$first" -ne 0 ] || [ "$left" -ne 0 ] || [ "$right" -ne 0 ]; then
  echo "pytest failed (exit status): phase 1 $first, phase 2 $left and $right"
  exit 1
fi
