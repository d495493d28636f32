#!/usr/bin/env bash
# The whole GPU suite and the GPU benchmarks in one command, on a machine with an NVIDIA GPU, CuPy 14 and
# cuDNN 9 installed and no network (see ../shared/GPU_NOTES.md), in under 10 minutes:
#
#     bash tests/gpu/run.sh OUT        # logs and results under OUT (default: $OUT, else gpu-out)
#
# Wheels the machine lacks (cffi, pycparser) are installed from .whl/ in the checkout if it is there. The
# native CPU kernels are built in place (the GPU tests compare the GPU build with them). It writes:
#   OUT/env.log           nvidia-smi and the versions of the packages that matter
#   OUT/build.log         the in-place build of the CPU kernels
#   OUT/gpu-tests.log     pytest of tests/gpu and the device tests (1-2 minutes)
#   OUT/gpu-bench.log     bench/gpu.py, and OUT/gpu-bench.json its figures (4-6 minutes; each training run in a
#                         process of its own, stopped with every thread's stack printed if it stalls)
#   OUT/conv-layouts.log  bench/gpu_conv_probe.py --layouts: cuDNN's fastest algorithms for VGG-16's
#                         convolutions channels last (vmem) and NCHW (PyTorch's default), and the graph
#                         API's engines channels last, about 1-2 minutes
# Limits (seconds) and extra bench arguments from the environment: VMEM_GPU_TESTS_S (130), VMEM_GPU_TEST_TIMEOUT
# (90, per test), VMEM_GPU_BENCH_S (360), VMEM_GPU_PROBE_S (80), VMEM_GPU_BENCH_ARGS (e.g. --quick).
source "$(dirname "$0")/env.sh" "$@"
{ nvidia-smi; $py -m pip list 2>/dev/null | grep -iE "^(cupy|nvidia-cudnn|nvidia-ml|torch |numpy|cffi|pycparser|pytest|hypothesis)"; } \
    > "$out/env.log" 2>&1
$py setup.py -q build_ext --inplace > "$out/build.log" 2>&1 || echo "native CPU kernels not built: see build.log"
# per-test limit where pytest-timeout is installed (the GPU machines have it): a hang costs one test, not the run
per_test=$($py -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${VMEM_GPU_TEST_TIMEOUT:-90}")
timeout "${VMEM_GPU_TESTS_S:-130}" $py -m pytest -q -rfE --tb=short -p no:cacheprovider $per_test tests/gpu tests/device \
    2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
timeout "${VMEM_GPU_BENCH_S:-360}" $py bench/gpu.py ${VMEM_GPU_BENCH_ARGS:-} --json-out "$out/gpu-bench.json" 2>&1 | tee "$out/gpu-bench.log"
bench=${PIPESTATUS[0]}
probe_s=${VMEM_GPU_PROBE_S:-80}
timeout "$probe_s" $py bench/gpu_conv_probe.py --layouts --stall-dump $((probe_s - 5)) 2>&1 | tee "$out/conv-layouts.log"
echo "gpu tests: exit $tests; gpu bench: exit $bench; conv layouts: exit ${PIPESTATUS[0]}; logs in $out"
exit $(( tests != 0 || bench != 0 ))
