#!/usr/bin/env bash
# One device call: run the named H200 scripts in order, each under its own time limit, logs to $OUT.
# Usage: bash bench/h200_run.sh gluon:240 triton:200 paged:150 pytest:120
# A script's arguments come from ARGS_<job>, e.g. ARGS_engine="--budget 90" bash bench/h200_run.sh engine:200
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/h200_install.sh
for job in "$@"; do
  name=${job%%:*}; limit=${job##*:}
  case $name in
    pytest) cmd="python -m pytest -q -m cuda tests -p no:cacheprovider" ;;
    check) cmd="python -m mqa_core.cli.main check --device cuda ${CHECK_ARGS:-}" ;;
    prefill) cmd="python -m mqa_core.cli.main bench --preset prefill --providers ${PROVIDERS:-gluon,triton,torch_ref} --baseline triton --json $OUT/prefill.jsonl --plot $OUT/prefill.png" ;;
    prefill_noclean) cmd="python -m mqa_core.cli.main bench --preset prefill --no-clean --providers ${PROVIDERS:-gluon,triton} --baseline triton --json $OUT/prefill_noclean.jsonl" ;;
    decode) cmd="python -m mqa_core.cli.main bench --preset decode --providers ${PROVIDERS:-gluon,torch_ref} --json $OUT/decode.jsonl --plot $OUT/decode.png" ;;
    *) args="ARGS_${name}"; cmd="python bench/h200_${name}.py ${!args:-}" ;;  # e.g. ARGS_engine="--budget 90"
  esac
  echo "=== $name (limit ${limit}s): $cmd"
  timeout "$limit" $cmd >"$OUT/$name.log" 2>&1; rc=$?
  echo "=== $name rc=$rc"; tail -n 40 "$OUT/$name.log"
done
