#!/usr/bin/env bash
# Download the wheels the GPU machines lack (cffi, pycparser and ml_dtypes for CPython 3.12 on x86-64) into .whl/,
# which git ignores here, so that the device tool can carry them: name .whl in its carry list, and
# tests/gpu/run.sh installs them. Run it on a machine with network, from the checkout's root.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info && { grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude; }
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "cffi>=1.17" pycparser "ml_dtypes>=0.5"
ls -l .whl
