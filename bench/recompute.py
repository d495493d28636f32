"""Recomputation (Echo) against its targets, in one run.

Simulated (sim:rtx-2080ti, Echo's GPU): NMT (seq_len 100, batch 128) under layerwise, mirror, chen and echo:
peak, the bytes attention and LSTM ops keep from forward to backward, predicted time overhead, planning time;
ResNet-152 at batch 32. Measured on the CPU device: nmt_small and a bench-sized NMT, step time and peak per
policy (median of ``--steps`` steps after a warm-up, the policies stepped in turn), predicted peak against
measured, and the weights after all steps against ``baseline``'s, bit for bit (both models have Dropout).

    python bench/recompute.py [--steps 12] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np
from _report import emit, verdict

import vmem

POLICIES = ("layerwise", "mirror", "chen", "echo")


def held(program, plan, prefixes=("att.", "enc", "dec")) -> int:
    """Bytes of attention and LSTM outputs kept from forward to backward."""
    return sum(program.tensor(n).nbytes for n, d in plan.stash.items() if d == "keep" and n.startswith(prefixes))


def simulated() -> dict:
    out: dict = {}
    net = vmem.models.get("nmt", seq_len=100)
    program = net.build(128)
    for policy in POLICIES:
        t = time.perf_counter()
        r = vmem.plan(net, 128, "sim:rtx-2080ti", policy, memory="1TiB", oversubscribe=True)
        out[f"nmt/{policy}"] = {
            "peak_gib": r.peak_bytes / 2**30,
            "step_s": r.step_seconds,
            "held_gib": held(program, r) / 2**30,
            "plan_s": time.perf_counter() - t,
        }
    res = vmem.models.get("resnet152")
    for policy in ("layerwise", "echo"):
        r = vmem.plan(res, 32, "sim:titan-x", policy, memory="1TiB", oversubscribe=True)
        out[f"resnet152/{policy}"] = {"peak_gib": r.peak_bytes / 2**30, "step_s": r.step_seconds}
    return out


def measured(steps: int) -> dict:
    # BLAS results can depend on its thread count, which the core budget follows under load: pin it so
    # that the policies' weights compare bit for bit (vmem.threads.CoreBudget)
    pinned = vmem.threads.BUDGET.fixed
    vmem.threads.BUDGET.fix(pinned or vmem.threads.BUDGET.cores)
    try:
        return _measured(steps)
    finally:
        vmem.threads.BUDGET.fix(pinned)


def _measured(steps: int) -> dict:
    out: dict = {}
    cases = {
        "nmt_small": (lambda: vmem.models.get("nmt_small", dropout=0.1), 64),
        "nmt_bench": (
            lambda: vmem.models.get(
                "nmt", seq_len=16, hidden=128, attention=128, layers=1, src_vocab=500, tgt_vocab=500, dropout=0.1
            ),
            32,
        ),
    }
    for name, (make, batch) in cases.items():
        net = make()
        length = net.input_shape[0] // 2
        data, _ = vmem.data.reverse(n=2 * batch, seq_len=length, vocab=50)
        x, y = data.x[:batch], data.y[:batch]
        with contextlib.ExitStack() as stack:
            trainers = {}
            for policy in (
                "baseline",
            ) + POLICIES:  # one trainer each, stepped in turn: load on the machine hits all alike
                dev = vmem.device("cpu", memory="256MiB")
                stack.callback(dev.close)
                trainers[policy] = stack.enter_context(
                    vmem.Trainer(make(), device=dev, policy=policy, optimizer=vmem.optim.Adam(lr=1e-3), seed=0)
                )
                trainers[policy].step(x, y)  # warm-up
            reports: dict[str, list] = {p: [] for p in trainers}
            for _ in range(steps):
                for policy, t in trainers.items():
                    reports[policy].append(t.step(x, y))
            for policy, t in trainers.items():
                secs = [r.seconds for r in reports[policy]]
                out[f"{name}/{policy}"] = {
                    "step_s": float(np.median(secs)),
                    "spread": max(secs) / min(secs),
                    "peak": reports[policy][-1].peak_bytes,
                    "planned_peak": t.plans[batch].peak_bytes,
                }
        base = trainers["baseline"].net.params  # the trainers are closed: weights are back in the networks
        for policy, t in trainers.items():
            params = t.net.params
            out[f"{name}/{policy}"]["bitwise"] = all(np.array_equal(base[k], params[k]) for k in base)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="measured steps per policy (default 12)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sim = simulated()
    cpu = measured(args.steps)
    lw, mi, ec = (sim[f"nmt/{p}"] for p in ("layerwise", "mirror", "echo"))
    print("sim:rtx-2080ti, nmt seq_len 100 batch 128")
    print(f"{'policy':<10}{'peak GiB':>10}{'held GiB':>10}{'step s':>9}{'plan s':>8}")
    for p in POLICIES:
        f = sim[f"nmt/{p}"]
        print(f"{p:<10}{f['peak_gib']:>10.3f}{f['held_gib']:>10.3f}{f['step_s']:>9.3f}{f['plan_s']:>8.1f}")
    print(
        f"echo: peak {lw['peak_gib'] / ec['peak_gib']:.2f}x below layerwise (>= 2), {ec['peak_gib'] / mi['peak_gib']:.2f}"
        f" of mirror's (<= 0.75); attention+LSTM kept {lw['held_gib'] / max(ec['held_gib'], 1e-9):.1f}x lower (>= 3);"
        f" time +{100 * (ec['step_s'] / lw['step_s'] - 1):.1f}% (<= 5, mirror +{100 * (mi['step_s'] / lw['step_s'] - 1):.1f}%)"
    )
    r_lw, r_ec = sim["resnet152/layerwise"], sim["resnet152/echo"]
    print(
        f"resnet152 batch 32 (sim:titan-x): layerwise {r_lw['peak_gib']:.2f} GiB / echo {r_ec['peak_gib']:.2f} GiB"
        f" = {r_lw['peak_gib'] / r_ec['peak_gib']:.2f}x (>= 1.5)"
    )
    print("\nCPU device, measured (median step; spread = slowest / fastest)")
    for name in ("nmt_small", "nmt_bench"):
        base = cpu[f"{name}/layerwise"]["step_s"]
        for p in POLICIES:
            f = cpu[f"{name}/{p}"]
            print(
                f"{name:<10}{p:<10} step {f['step_s'] * 1e3:7.1f} ms ({100 * (f['step_s'] / base - 1):+5.1f}%, "
                f"spread {f['spread']:.2f})  peak {f['peak'] / 2**20:7.2f} MiB, planned {f['planned_peak'] / 2**20:7.2f}"
                f" {'(equal)' if f['peak'] == f['planned_peak'] else '(DIFFERS)'}; weights "
                f"{'bitwise equal to' if f['bitwise'] else 'DIFFER from'} baseline's"
            )
    targets = [
        verdict("echo: layerwise peak / echo peak (nmt, sim)", lw["peak_gib"] / ec["peak_gib"], 2.0),
        verdict("echo peak / mirror peak (nmt, sim)", ec["peak_gib"] / mi["peak_gib"], 0.75, at_least=False),
        verdict("attention+LSTM kept, layerwise / echo", lw["held_gib"] / max(ec["held_gib"], 1e-9), 3.0),
        verdict("echo time overhead over layerwise (nmt, sim)", ec["step_s"] / lw["step_s"] - 1, 0.05, at_least=False),
        verdict("resnet152(32): layerwise peak / echo peak", r_lw["peak_gib"] / r_ec["peak_gib"], 1.5),
    ]
    for name in ("nmt_small", "nmt_bench"):
        overhead = cpu[f"{name}/echo"]["step_s"] / cpu[f"{name}/layerwise"]["step_s"] - 1
        targets.append(
            verdict(f"{name} on the CPU device: echo's step overhead over layerwise", overhead, 0.15, at_least=False)
        )
    return emit({"bench": "recompute", "sim": sim, "cpu": cpu, "targets": targets}, args.json)


if __name__ == "__main__":
    sys.exit(main())
