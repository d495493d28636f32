#!/usr/bin/env bash
# The GPU run, on a machine with an NVIDIA GPU, CuPy 14 and cuDNN 9 and no network (see tests/gpu/README.md):
#
#     bash tests/gpu/run.sh check                 # the GPU check: one command, at most 7 minutes
#     bash tests/gpu/run.sh STAGE [STAGE ...]     # the longer stages, for a longer lease
#
# Logs and results go under $OUT (else gpu-out). Stages and their limits (seconds; VMEM_GPU_<STAGE>_S
# overrides, e.g. VMEM_GPU_SUITE_A_S=300):
#   check         345  in this order, check.json rewritten after each section: build and preflight; a smoke
#                      of the suite (protocol, layers, half-precision training, first commands); PyTorch in
#                      three settings (defaults, AMP bf16 channels-last, TF32 off); vmem bf16 and TF32 steps;
#                      vmem exact FP32 with every span; the 8 GiB batch in bf16 and FP32 (planned, then a
#                      step measured at the planned batch); vmem bf16 under auto in half its baseline's peak;
#                      last, vmem bf16 with its steps replayed as CUDA graphs (graphs on / off)
#   preflight      40  driver, versions, one NVML reading and the first kernel compile timed, vmem check
#   suite-a       200  pytest: the Device protocol, kernels and layers on cuda:0, and tests/device
#   suite-b       240  pytest: training on cuda:0 and a user's first commands (CLI, fit, save/load, the wheel)
#   bench-cheap    90  bench/gpu.py copies, kernels, codecs
#   bench-step    330  bench/gpu.py step_time (vmem per policy and PyTorch, VGG-16 at batch 64)
#   bench-budget  260  bench/gpu.py budget (the largest VGG-16 batch in 8 GiB)
#   bench-variants 90 bench/gpu.py variants, then bench/gpu_conv_probe.py --layouts
#   bench-resnet  240  bench/gpu.py resnet50 (ResNet-50 at batch 128, vmem bf16 against PyTorch AMP bf16)
# Each stage runs under `timeout -s INT` (pytest and the bench print their summary and keep their JSON when
# the limit is hit), killed 10 s later if it has not stopped. The first stage also installs the carried
# wheels (.whl/) and builds the native CPU kernels in place. CuPy's kernel cache and the bench's profiles
# live in .gpu-cache/ in the checkout, which a warm machine keeps from one command to the next.
# VMEM_GPU_DRY_RUN=1: no GPU is needed; every stage runs its commands (the tests skip, the bench says there
# is no GPU), so that the time a stage takes besides its GPU work is measured (tests/test_gpu_commands.py).
source "$(dirname "$0")/env.sh"
if [ $# -eq 0 ]; then
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
declare -A LIMIT=([check]=345 [preflight]=40 [suite-a]=200 [suite-b]=240 [bench-cheap]=90 [bench-step]=330
                  [bench-budget]=260 [bench-variants]=90 [bench-resnet]=240)
for stage in "$@"; do
    [ -n "${LIMIT[$stage]:-}" ] || { echo "run.sh: unknown stage '$stage'; stages: ${!LIMIT[*]}" >&2; exit 2; }
done
limit_of() { local var="VMEM_GPU_$(echo "$1" | tr 'a-z-' 'A-Z_')_S"; echo "${!var:-${LIMIT[$1]}}"; }
cache=$PWD/.gpu-cache
mkdir -p "$cache/cupy" "$cache/profiles"
export CUPY_CACHE_DIR=$cache/cupy
per_test=$($py -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120")
pytest_run() {  # limit log paths...
    local limit=$1 log=$2; shift 2
    # -o addopts: in this process, one test at a time on the one GPU (the suite's default runs workers)
    timeout -s INT -k 10 "$limit" $py -m pytest -q -o addopts= -rfE --tb=short -p no:cacheprovider --durations=15 $per_test "$@" \
        2>&1 | tee "$out/$log"
    return "${PIPESTATUS[0]}"
}
bench() {  # limit log json sections [extra args]
    local limit=$1 log=$2 json=$3 sections=$4; shift 4
    timeout -s INT -k 10 "$limit" $py bench/gpu.py --sections "$sections" --json-out "$out/$json" \
        --profile-cache "$cache/profiles" --child-timeout $(( limit > 170 ? 150 : limit - 20 )) ${VMEM_GPU_BENCH_ARGS:-} "$@" \
        2>&1 | tee "$out/$log"
    return "${PIPESTATUS[0]}"
}
preflight_run() {  # limit
    { nvidia-smi 2>&1 || echo "nvidia-smi: not here"; $py -m pip list 2>/dev/null \
        | grep -iE "^(cupy|nvidia-cudnn|nvidia-ml|torch |numpy|cffi|pycparser|ml.dtypes|pytest|hypothesis)"; } > "$out/env.log"
    $py setup.py -q build_ext --inplace > "$out/build.log" 2>&1 || echo "native CPU kernels not built: see build.log"
    timeout -s INT -k 10 "$1" $py tests/gpu/preflight.py --json-out "$out/preflight.json" 2>&1 | tee "$out/preflight.log"
    return "${PIPESTATUS[0]}"
}
check_sections=""
check_note() {  # name rc seconds limit: check.json rewritten with every section so far
    check_sections+="${check_sections:+,}{\"section\": \"$1\", \"exit\": $2, \"seconds\": $3, \"limit\": $4}"
    printf '{"stage": "check", "dry_run": %s, "sections": [%s]}\n' \
        "$([ "${VMEM_GPU_DRY_RUN:-0}" = 1 ] && echo true || echo false)" "$check_sections" > "$out/check.json"
}
check_run() {  # limit: the GPU check's sections in order, each under its share of the limit
    local limit=$1 rc=0 r t share
    local -a names=(preflight smoke bench) shares=(33 91 0)  # of 345 s; the bench takes the rest
    for i in 0 1 2; do
        share=$(( shares[i] * limit / 345 ))
        [ "$i" -eq 2 ] && share=$(( limit - shares[0] * limit / 345 - shares[1] * limit / 345 ))
        t=$SECONDS
        echo "-- check: ${names[i]} (at most $share s)"
        case ${names[i]} in
            preflight) preflight_run "$share"; r=$? ;;
            smoke)
                pytest_run "$share" check-smoke.log tests/gpu/test_protocol.py tests/gpu/test_layers.py \
                    tests/gpu/test_training.py tests/gpu/test_first_commands.py \
                    -k "test_protocol or test_layers or test_first_commands or half or bf16 or fp16"; r=$?
                [ "$r" -eq 5 ] && r=0 ;;  # nothing collected (no GPU: every test skips)
            bench)
                local dry=""; [ "${VMEM_GPU_DRY_RUN:-0}" = 1 ] && dry="--dry-run"
                bench "$share" check-bench.log check-bench.json bf16,tf32,exact,half_memory,budget_check,graphs,graph_api \
                    --child-timeout 110 $dry; r=$? ;;
        esac
        check_note "${names[i]}" "$r" "$(( SECONDS - t ))" "$share"
        [ "$r" -eq 0 ] || rc=1
    done
    return $rc
}
status=0
summary=""
for stage in "$@"; do
    limit=$(limit_of "$stage")
    t0=$SECONDS
    echo "== $stage (limit ${limit} s) =="
    case $stage in
        check)
            check_run "$limit"; rc=$? ;;
        preflight)
            preflight_run "$limit"; rc=$? ;;
        suite-a)
            # tests/device without the CuPy stand-in (it stands in for this GPU on machines without one)
            pytest_run "$limit" suite-a.log tests/gpu/test_protocol.py tests/gpu/test_kernels.py tests/gpu/test_layers.py \
                tests/device --ignore=tests/device/test_cuda_standin.py --ignore=tests/device/test_cuda_graphs.py \
                --ignore=tests/device/test_cuda_graph_api.py --ignore=tests/device/test_cuda_linear.py \
                --ignore=tests/device/test_cuda_input_ring.py; rc=$? ;;
        suite-b)
            pytest_run "$limit" suite-b.log tests/gpu/test_training.py tests/gpu/test_first_commands.py; rc=$? ;;
        bench-cheap)
            bench "$limit" bench-cheap.log bench-cheap.json copies,kernels,codecs; rc=$? ;;
        bench-step)
            bench "$limit" bench-step.log bench-step.json step_time; rc=$? ;;
        bench-budget)
            bench "$limit" bench-budget.log bench-budget.json budget; rc=$? ;;
        bench-resnet)
            bench "$limit" bench-resnet.log bench-resnet.json resnet50 --child-timeout 200; rc=$? ;;
        bench-variants)
            bench "$(( limit * 3 / 5 ))" bench-variants.log bench-variants.json variants; rc=$?
            probe=$(( limit * 2 / 5 ))
            timeout -s INT -k 10 "$probe" $py bench/gpu_conv_probe.py --layouts --stall-dump $(( probe - 5 )) 2>&1 \
                | tee "$out/conv-layouts.log"
            probe_rc=${PIPESTATUS[0]}
            [ "$rc" -ne 0 ] || rc=$probe_rc ;;
    esac
    if [ "${VMEM_GPU_DRY_RUN:-0}" = 1 ] && [ "${stage#bench}" != "$stage" ] && [ "$rc" -eq 2 ]; then
        rc=0  # a dry run: the bench said there is no GPU, as it should
    fi
    summary+="$stage: exit $rc in $(( SECONDS - t0 )) s of ${limit} s"$'\n'
    [ "$rc" -eq 124 ] && echo "$stage: stopped at its limit of ${limit} s"
    [ "$rc" -eq 0 ] || status=1
done
printf "%s" "$summary" | tee "$out/stages.log"
echo "logs in $out"
exit $status
