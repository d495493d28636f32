"""vmem's side of the GPU bench (bench/gpu.py): the training runs each child process makes (a step timed with
its plan and spans; the largest batch planned and one step measured), and what they report."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np

from _isolate import say

import vmem


def task_vmem_step(
    policy: str,
    batch: int,
    steps: int,
    memory: str | None = None,
    profile: bool = True,
    profile_cache: str | None = None,
    conv_api: str = "legacy",
    nchw: bool = False,
    precision: str = "fp32",
    math: str = "exact",
    spans: bool = False,
    model: str = "vgg16",
    graphs: str = "off",
) -> dict:
    """Median step seconds of vmem on ``model`` (VGG-16 unless named; after two warm-up steps) and what the
    plan chose, its feature
    maps in ``precision`` on a device whose FP32 math is ``math`` (``spans``: every span of the last step
    too, as [stream, name, kind, start ms, ms]; ``graphs="on"``: steps replayed as CUDA graphs). With
    ``profile``, the plan uses measured costs: those in ``profile_cache`` if it exists, else a profile
    made here (and saved there). The profile runs each layer on its own with its buffers in the arena: in
    a tight budget at a large batch they may not fit (``profile=False`` plans from the device's
    specification and cuDNN's catalog)."""
    net = vmem.models.get(model)
    dev = vmem.device(
        "cuda:0", conv_api=conv_api, nchw=nchw, math=math, graphs=graphs, **({"memory": memory} if memory else {})
    )
    say(repr(dev))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 1000, batch)
    cache = Path(profile_cache) if profile and profile_cache else None
    try:
        with vmem.Trainer(
            net,
            device=dev,
            policy=policy,
            profile=profile,
            seed=0,
            precision=precision,
            optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9),
        ) as trainer:
            t0 = time.perf_counter()
            if cache is not None and cache.exists():
                trainer.costs[batch] = pickle.loads(cache.read_bytes())
                say(f"profile from {cache}")
            elif profile:
                trainer.profile(batch)
                say(f"profile made in {time.perf_counter() - t0:.1f} s")
                if cache is not None:
                    cache.write_bytes(pickle.dumps(trainer.costs[batch]))
            t1 = time.perf_counter()
            trainer.step(x, y)
            say(f"vmem {policy}, batch {batch}: plan and first step {time.perf_counter() - t1:.1f} s")
            trainer.step(x, y)
            reports = [trainer.step(x, y) for _ in range(steps)]
            times = [r.seconds for r in reports]
            plan = trainer.plans[batch]
            say(f"vmem {policy}: steps {', '.join(f'{t * 1e3:.1f}' for t in times)} ms")
            kinds, ops = breakdown(reports[-1])
            say(
                "last step's compute stream by op kind (ms): "
                + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            )
            say("its slowest ops (ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ops[:12]))
            profiled = profiled_summary(trainer.costs.get(batch), plan.plan.algos)
            if profiled:
                say(f"profiled (ms, the plan's algorithms): {profiled['line']}")
            return {
                "median": float(np.median(times)),
                "times": times,
                "chosen": plan.chosen or plan.policy,
                "peak_bytes": plan.peak_bytes,
                "step": plan.step,
                "predicted_seconds": getattr(plan, "step_seconds", None),
                "profiled": profile,
                "by_kind": kinds,
                **({"profiled_ops": profiled} if profiled else {}),
                "algos": plan.plan.algos,
                "precision": precision,
                "math": math,
                "graphs": [r.graph for r in reports],
                **({"spans": every_span(reports[-1])} if spans else {}),
            }
    finally:
        dev.close()


def profiled_summary(costs, algos) -> dict | None:
    """What a profile measured, to set beside the step's spans: per pass, the sum of the ops' times with the
    plan's algorithms (the fastest measured where the plan names none); the update, the element-wise rate
    and the host's overheads; the 12 largest op times. None without a profile."""
    times = getattr(costs, "times", None)
    if not times:
        return None
    best: dict[tuple[str, str], float] = {}
    for (op, pass_, algo), t in times.items():
        chosen = (algos.get(op) or {}).get(pass_) if isinstance(algos, dict) else None
        if chosen is not None and algo != chosen:
            continue
        if t == t and t != float("inf"):
            best[(op, pass_)] = min(t, best.get((op, pass_), float("inf")))
    per_pass: dict[str, float] = {}
    for (_, pass_), t in best.items():
        per_pass[pass_] = per_pass.get(pass_, 0.0) + t
    top = sorted(best.items(), key=lambda kv: -kv[1])[:12]
    line = (
        ", ".join(f"{p} {t * 1e3:.1f}" for p, t in sorted(per_pass.items(), key=lambda kv: -kv[1]))
        + f"; update {getattr(costs, 'update', 0.0) * 1e3:.1f}, element-wise {getattr(costs, 'elementwise_gbps', 0):.0f}"
        + f" GB/s, host {tuple(round(v * 1e6, 1) for v in costs.host_overheads())} us; largest: "
        + ", ".join(f"{op}.{p} {t * 1e3:.1f}" for (op, p), t in top)
    )
    return {
        "per_pass_ms": {p: t * 1e3 for p, t in per_pass.items()},
        "largest_ms": [[op, p, t * 1e3] for (op, p), t in top],
        "notes": list(getattr(costs, "notes", []))[:20],
        "line": line,
    }


def breakdown(report) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Seconds of a step's compute-stream spans per op kind (``conv``, ``conv.backward``, ``relu``...,
    ``wait`` for stalls) and every span, slowest first: where the step's time goes."""
    kinds: dict[str, float] = {}
    ops = []
    for span in report.spans:
        if span.stream != "compute":
            continue
        base = (
            span.name.rstrip("0123456789")
            if "." not in span.name
            else span.name.split(".")[0].rstrip("0123456789") + "." + span.name.split(".", 1)[1]
        )
        kind = "wait" if span.kind == "wait" else base
        kinds[kind] = kinds.get(kind, 0.0) + span.seconds
        ops.append((span.name, span.seconds))
    return kinds, sorted(ops, key=lambda kv: -kv[1])


def every_span(report) -> list[list]:
    """Every span of a step as [stream, name, kind, start ms from the step's first span, ms]."""
    first = min((span.start for span in report.spans), default=0.0)
    return [
        [span.stream, span.name, span.kind, round((span.start - first) * 1e3, 4), round(span.seconds * 1e3, 4)]
        for span in sorted(report.spans, key=lambda sp: sp.start)
    ]


def task_vmem_largest(
    budget: str, precision: str = "fp32", policies: tuple = ("baseline", "vdnn-conv", "vdnn-all")
) -> dict:
    """The largest VGG-16 batch each policy's plan fits in ``budget`` with feature maps in ``precision``
    (plans only: nothing runs)."""
    net = vmem.models.get("vgg16")
    with vmem.device("cuda:0", memory=budget) as dev:
        return {
            policy: vmem.largest_batch(net, dev, policy=policy, precision=precision, most=4095) for policy in policies
        }
