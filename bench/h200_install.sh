#!/usr/bin/env bash
# Sourced by the H200 run scripts: install this checkout's distributions (entry points need them)
# into the device's python, saying which install failed. The packages declare SPDX license strings,
# which need setuptools >= 77: a wheel of it may be carried in .wheels/ (the device has no index).
ls .wheels/setuptools-*.whl >/dev/null 2>&1 && python -m pip install -q --no-index .wheels/setuptools-*.whl
for dist in . providers/*/; do
  python -m pip install --no-deps --no-build-isolation -q -e "$dist" >"$OUT/pip.log" 2>&1 \
    || { echo "pip install -e $dist failed:"; tail -n 3 "$OUT/pip.log"; }
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
