#!/usr/bin/env bash
# The whole GPU suite and the GPU benchmarks in one command, on a machine with an NVIDIA GPU, CuPy 14 and
# cuDNN 9 installed and no network (see ../shared/GPU_NOTES.md):
#
#     bash tests/gpu/run.sh OUT        # logs and results under OUT (default: $OUT, else gpu-out)
#
# Wheels the machine lacks (cffi, pycparser) are installed from .whl/ in the checkout if it is there. The
# native CPU kernels are built in place (the GPU tests compare the GPU build with them). It writes:
#   OUT/env.log         nvidia-smi and the versions of the packages that matter
#   OUT/build.log       the in-place build of the CPU kernels
#   OUT/gpu-tests.log   pytest of tests/gpu and the device tests (about 2-4 minutes)
#   OUT/gpu-bench.log   bench/gpu.py, and OUT/gpu-bench.json its figures (about 3-5 minutes)
# Limits (seconds) and extra bench arguments from the environment: VMEM_GPU_TESTS_S (330), VMEM_GPU_BENCH_S
# (330), VMEM_GPU_TEST_TIMEOUT (120, per test), VMEM_GPU_BENCH_ARGS (e.g. --quick).
source "$(dirname "$0")/env.sh" "$@"
{ nvidia-smi; $py -m pip list 2>/dev/null | grep -iE "^(cupy|nvidia-cudnn|nvidia-ml|torch |numpy|cffi|pycparser|pytest|hypothesis)"; } \
    > "$out/env.log" 2>&1
$py setup.py -q build_ext --inplace > "$out/build.log" 2>&1 || echo "native CPU kernels not built: see build.log"
# per-test limit where pytest-timeout is installed (the GPU machines have it): a hang costs one test, not the run
per_test=$($py -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${VMEM_GPU_TEST_TIMEOUT:-120}")
timeout "${VMEM_GPU_TESTS_S:-330}" $py -m pytest -q -rfE --tb=short -p no:cacheprovider $per_test tests/gpu tests/device \
    2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
timeout "${VMEM_GPU_BENCH_S:-330}" $py bench/gpu.py ${VMEM_GPU_BENCH_ARGS:-} --json-out "$out/gpu-bench.json" 2>&1 | tee "$out/gpu-bench.log"
bench=${PIPESTATUS[0]}
echo "gpu tests: exit $tests; gpu bench: exit $bench; logs in $out"
exit $(( tests != 0 || bench != 0 ))
