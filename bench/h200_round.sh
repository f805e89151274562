#!/usr/bin/env bash
# One H200 call that proves and measures a round: correctness first (the cuda tests and the
# conformance kit, side by side since neither is timed), then the benchmarks against DeepGEMM one
# after another, each under its own time limit so a slow one cannot starve the rest. Everything
# lands in $OUT/results.tgz; the tables are printed last (the device tool returns the output's end).
# DeepGEMM must be importable (PYTHONPATH); without it the scripts say so and leave its columns out.
# Usage (repo root): bash bench/h200_round.sh   (limits: T_PYTEST T_CHECK T_ENGINE T_LAUNCH T_DECODE T_VARIANTS T_TUNED)
set -u
FINAL_OUT=${OUT:-/tmp/out}; RUN=$(mktemp -d); export OUT=$RUN PYTHONUNBUFFERED=1
mkdir -p "$FINAL_OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
source bench/h200_install.sh
python -c "import deep_gemm; print('deep_gemm', deep_gemm.__version__)" 2>&1 | tail -n 1
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "${COMMIT:-unknown}")

stamp "correctness: pytest -m cuda and mqa check, side by side"
timeout "${T_PYTEST:-200}" python -m pytest -v -m cuda tests -p no:cacheprovider >"$RUN/pytest.log" 2>&1 &
pytest_pid=$!
timeout "${T_CHECK:-130}" mqa check --device cuda --provider gluon --provider triton --provider deepgemm \
  -k "not large_index" >"$RUN/check.log" 2>&1 &
check_pid=$!
wait $pytest_pid; echo "pytest rc=$?" >>"$RUN/rc.txt"
wait $check_pid; echo "check rc=$?" >>"$RUN/rc.txt"

stamp "engine preset and host cost"
timeout "${T_ENGINE:-95}" python bench/h200_engine.py --budget 65 --commit "$COMMIT" >"$RUN/engine.log" 2>&1
echo "engine rc=$?" >>"$RUN/rc.txt"
stamp "host cost per call, launchers and levels, beside DeepGEMM"
timeout "${T_LAUNCH:-60}" sh -c 'python bench/h200_launch.py && python bench/h200_launch.py --paged' >"$RUN/launch.log" 2>&1
echo "launch rc=$?" >>"$RUN/rc.txt"
stamp "paged decode against DeepGEMM"
timeout "${T_DECODE:-110}" python bench/h200_decode_vs_deepgemm.py --budget 70 --deadline 100 >"$RUN/decode.log" 2>&1
echo "decode rc=$?" >>"$RUN/rc.txt"
stamp "Gluon launch variants on the weak shapes"
timeout "${T_VARIANTS:-85}" python bench/h200_engine.py --variants "${VARIANTS:-today,rule,bal+fill,dyn+fill+bal,dyn+fill,ips8,r240,triton}" \
  --budget 72 --precheck-timeout 30 --commit "$COMMIT" >"$RUN/variants.log" 2>&1
echo "variants rc=$?" >>"$RUN/rc.txt"
stamp "tuned selection"
timeout "${T_TUNED:-75}" python bench/h200_tuned.py --tune-budget 25 --budget 58 >"$RUN/tuned.log" 2>&1
echo "tuned rc=$?" >>"$RUN/rc.txt"
stamp "done"

tar czf "$FINAL_OUT/results.tgz" -C "$RUN" .
echo "===== exit codes"; cat "$RUN/rc.txt"
echo "===== pytest ($(grep -c " PASSED" "$RUN/pytest.log") passed as they ran)"
grep -E " (FAILED|ERROR)|^(FAILED|ERROR)|[0-9]+ passed|[0-9]+ failed" "$RUN/pytest.log" | sort -u | tail -n 14
echo "===== check"; tail -n 8 "$RUN/check.log"
echo "===== engine"; tail -n 26 "$RUN/engine.log"
echo "===== launch"; tail -n 40 "$RUN/launch.log"
echo "===== decode"; tail -n 30 "$RUN/decode.log"
echo "===== variants"; tail -n 24 "$RUN/variants.log"
echo "===== tuned"; tail -n 16 "$RUN/tuned.log"
