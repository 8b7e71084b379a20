#!/usr/bin/env bash
# Installs cuptistream with its dev tools into .venv (created if missing) and runs every test.
# GPU tests skip cleanly where there is no NVIDIA driver. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
exec .venv/bin/python -m pytest "$@"
