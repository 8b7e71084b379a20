#!/usr/bin/env bash
# Installs cuptistream with its dev tools into .venv (created if missing) and runs the tests.
#
#   bash scripts/test.sh           the fast tests: a few minutes on two cores
#   bash scripts/test.sh --all     every test, the slow ones too: those that start a Kafka broker, run
#                                  a fault matrix, fuzz, install a wheel or run a bench script (CI runs this)
#
# GPU tests skip cleanly where there is no NVIDIA driver. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
    select=()
    shift
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
exec .venv/bin/python -m pytest "${select[@]}" "$@"
