#!/usr/bin/env bash
# Where does vmem's profile of VGG-16 at batch 64 stall on a GPU? (issue 12: it did in three runs on an
# H100 with the default arena, PyTorch having run first in the same process, while one layer's algorithms
# ran in 2 s in a 40 GiB arena.) Runs the profile in three settings, each in its own process with a time
# limit and every thread's stack printed if it stalls:
#
#     bash tests/gpu/diagnose-profile.sh OUT     # OUT/profile-{32GiB,all,all-torch}.log, about 3 minutes at most
source "$(dirname "$0")/env.sh" "$@"
limit=${VMEM_DIAGNOSE_S:-60}
for setting in "32GiB" "all" "all --with-torch"; do
    name=profile-$(echo "$setting" | tr -d ' -' | sed 's/withtorch/-torch/')
    echo "== --memory $setting (limit ${limit} s)"
    timeout "$limit" $py bench/gpu_conv_probe.py --profile --memory $setting --stall-dump $((limit - 10)) \
        2>&1 | tee "$out/$name.log" | tail -25
    echo "== exit ${PIPESTATUS[0]}"
done
