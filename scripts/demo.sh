#!/usr/bin/env bash
# Installs cuptistream into .venv and runs the collector on a small sample workload, writing
# zstd-compressed event files to ./cuptistream-out/, then prints a few of the events.
# Without a GPU it says so and replays a real CUPTI capture (sources/captures/) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
if .venv/bin/python -c "import ctypes, sys; sys.exit(ctypes.CDLL('libcuda.so.1').cuInit(0))" 2>/dev/null; then
    .venv/bin/cuptistream run -c configs/default.yaml -- python examples/sample_workload.py
elif compgen -G "sources/captures/*.cupti" > /dev/null; then
    echo "cuptistream: no NVIDIA GPU/driver here; replaying real CUPTI captures taken on an H200 (sources/captures/) instead" >&2
    .venv/bin/cuptistream run -c configs/replay.yaml -- python -c "pass"
else
    echo "cuptistream: no NVIDIA GPU/driver here, and no recorded capture to replay yet; run this on a GPU machine" >&2
    exit 3
fi
echo "--- first events (cuptistream cat cuptistream-out | head):"
.venv/bin/cuptistream cat cuptistream-out | head -n 5 | cut -c 1-200
