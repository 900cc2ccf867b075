#!/usr/bin/env bash
# `make test`: the whole suite in two lanes side by side, one per core of a 2-core machine.
#
#   lane 1: the main suite in .venv, less the files of the second lane (it prints as it goes);
#   lane 2: builds .venv-vllm if needed, runs the vLLM lane (tests/test_vllm*.py) and then the main suite's
#           files named in SECOND_LANE, in .venv; its report ($REPORTS/second.log) is printed when both end.
#
# The vLLM lane mostly waits for its engines' processes to start and stop, so it shares a machine well; which
# of the main suite's files join it is chosen from the durations each `make test` keeps (tests/durations.py),
# so that both lanes end at about the same time. Either lane failing fails `make test`. Called by the Makefile
# with: PY VLLM_PY REPORTS MAKE VLLM_STAMP SECOND_LANE.
#
# Each lane's processes run one OpenMP thread (unless OMP_NUM_THREADS is set): with two threads per process on two
# cores beside the other lane, torch's threads wait on each other. Measured 2026-11-28 on this 2-core machine,
# tests/test_training.py beside test_distributed.py + test_bench.py: 296 and 282 s with torch's default threads,
# 204 and 243 s with one (CPU time of the first 172 -> 88 s: the same work, less spinning).
set -u
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
: "${PY:?}" "${VLLM_PY:?}" "${REPORTS:?}" "${MAKE:?}" "${VLLM_STAMP:?}" "${SECOND_LANE:?}"
mkdir -p "$REPORTS"
rm -f "$REPORTS"/*.xml
ignored=()
for file in $SECOND_LANE; do ignored+=("--ignore=$file"); done

second_lane() {
    "$MAKE" --no-print-directory "$VLLM_STAMP" || return 1
    "$VLLM_PY" -m pytest -q -m vllm --durations=10 --junitxml="$REPORTS/vllm.xml" tests/test_vllm*.py
    local vllm=$?
    # shellcheck disable=SC2086  # SECOND_LANE is a list of paths
    "$PY" -m pytest -q -p no:cacheprovider --durations=10 --junitxml="$REPORTS/main-second.xml" $SECOND_LANE
    local second=$?
    echo "vLLM lane: exit $vllm; the main suite's files of this lane: exit $second"
    [ "$vllm" -eq 0 ] && [ "$second" -eq 0 ]
}

echo "two lanes: the main suite here; the vLLM lane, then $SECOND_LANE, beside it (report: $REPORTS/second.log)"
second_lane > "$REPORTS/second.log" 2>&1 &
lane=$!
"$PY" -m pytest -q --durations=10 --junitxml="$REPORTS/main.xml" "${ignored[@]}"
main=$?
wait "$lane"
second=$?
echo
echo "== the second lane: the vLLM lane (tests/test_vllm*.py in .venv-vllm), then $SECOND_LANE =="
cat "$REPORTS/second.log"
"$PY" tests/durations.py
echo "main suite: exit $main; second lane: exit $second"
[ "$main" -eq 0 ] && [ "$second" -eq 0 ]
