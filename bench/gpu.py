"""GPU benchmarks (issue 12): ratios measured in one run on one GPU, vmem against PyTorch eager.

1. Step time, VGG-16 at batch 64 (224x224), FP32 with TF32 off on both sides: vmem baseline (fastest
   cuDNN algorithms, from a profile) / PyTorch eager (target <= 1.15); vdnn-all / vmem baseline (<= 1.2);
   vdnn-dyn / vmem baseline where baseline fits (<= 1.05). vmem's convolutions go through cuDNN's legacy
   API with each algorithm also offered on NCHW copies (``--no-nchw``: channels last only; ``--conv-api
   graph``: the graph API's engines). PyTorch is also timed channels last (vmem's layout), for what the
   layout alone costs.
2. The largest batch that trains VGG-16 in an 8 GiB budget: vmem under each policy (``memory="8GiB"``)
   against PyTorch held to 8 GiB (``set_per_process_memory_fraction``) plain, with
   ``save_on_cpu(pin_memory=True)`` and with ``torch.utils.checkpoint`` (target: vmem's best >= 2x plain).
3. (``variants``) vmem baseline through the convolution options the main runs did not use (by default:
   the legacy API channels last only; the graph API), against PyTorch's step of section 1.
4. Pinned copies through vmem's device / raw ``cudaMemcpyAsync`` between the same kind of buffers (>= 0.9).
5. The encoding kernels' throughput on the GPU (GB/s of float32 input).
6. Offload and prefetch through each GPU codec.

Each section runs on its own: a failure is printed and recorded, and the others still run. The training
runs of sections 1 to 3 each run in a process of their own (a fresh CUDA context: vmem's arena never
sits beside PyTorch's cache), under a time limit (``--child-timeout``); one that runs past it has every
thread's stack printed, is stopped and recorded as stalled, and the section goes on. The profile the
first vmem run makes is kept and given to the later ones (``--profile-cache``); if it cannot be made,
baseline is timed with algorithms chosen without one, and says so.

The training runs' vmem side is ``bench/_vmem_side.py``, PyTorch's ``bench/_torch_side.py``, the process
harness ``bench/_isolate.py``, the copy, kernel and codec measures ``bench/_micro.py``; this file holds the
sections and the command line.

    python bench/gpu.py [--batch 64] [--budget 8GiB] [--steps 5] [--quick] [--sections a,b] [--json-out PATH]
                        [--conv-api legacy|graph] [--no-nchw] [--child-timeout 150]
"""

from __future__ import annotations

import argparse
import faulthandler
import datetime
import json
import signal
import sys
import tempfile
import traceback
from pathlib import Path


import _isolate
from _isolate import ChildFailed, say
from _report import machine, table, verdict
from _micro import section_codecs, section_copies, section_kernels
from _torch_side import TORCH_SETTINGS, task_torch_largest, task_torch_step
from _vmem_side import task_vmem_largest, task_vmem_step

from vmem import format_bytes

GiB = 1 << 30


def isolated(task: str, timeout: float, **kwargs) -> dict:
    """``task`` (a key of :data:`TASKS`) run in a process of its own (:func:`_isolate.isolated`)."""
    return _isolate.isolated(__file__, task, timeout, **kwargs)


TASKS = {
    "vmem_step": task_vmem_step,
    "torch_step": task_torch_step,
    "vmem_largest": task_vmem_largest,
    "torch_largest": task_torch_largest,
}


# -- sections ------------------------------------------------------------------------------------------
def _failed(out: dict, what: str, exc: Exception) -> None:
    say(f"{what}: {exc}")
    out["errors"][what] = str(exc)


def _variant(api: str, nchw: bool) -> str:
    if api == "graph":  # its engines read the tensors as they are: NCHW copies are the legacy API's
        return "cuDNN graph API"
    return "cuDNN legacy API" + (" + NCHW algorithms" if nchw else ", channels last only")


def _vmem_run(
    args, out, rows, policy: str, profile: bool, api: str | None = None, nchw: bool | None = None
) -> dict | None:
    """One vmem run in its own process (see :func:`task_vmem_step`), its row added to ``rows``; None if it
    failed or stalled (recorded in ``out``). Runs with the same convolution options share one profile."""
    api = args.conv_api if api is None else api
    nchw = args.nchw if nchw is None else nchw
    main = _variant(api, nchw) == _variant(args.conv_api, args.nchw)
    label = policy + ("" if profile else " (no profile)") + ("" if main else f" [{_variant(api, nchw)}]")
    cache = Path(args.profile_cache) / f"profile-b{args.batch}-{api}{'-nchw' if nchw else ''}.pkl"
    try:
        r = isolated(
            "vmem_step",
            args.child_timeout,
            policy=policy,
            profile=profile,
            profile_cache=str(cache) if profile else None,
            conv_api=api,
            nchw=nchw,
            batch=args.batch,
            steps=args.steps,
            memory=args.memory,
        )
    except ChildFailed as exc:
        _failed(out, f"vmem {label}", exc)
        return None
    predicted = r["predicted_seconds"]
    rows.append(
        (
            label,
            f"{r['median'] * 1e3:.1f}",
            f"{predicted * 1e3:.1f}" if predicted else "-",
            r["chosen"],
            format_bytes(r["peak_bytes"]),
        )
    )
    out.setdefault("step_runs", {})[label] = r
    r["profiled_here"] = cache.exists()
    return r


def section_step_time(args, out):
    rows, times = [], {}
    print(f"vmem's convolutions: {_variant(args.conv_api, args.nchw)}")
    # baseline makes the profile the others reuse; without one (it failed or stalled), baseline and vdnn-all
    # are timed with the algorithms the cost model ranks first, and vdnn-dyn, which needs one, is left out
    r = _vmem_run(args, out, rows, "baseline:algos=performance", True)
    profiled = r is not None and r["profiled_here"]
    if r is None:
        r = _vmem_run(args, out, rows, "baseline:algos=performance", False)
    if r is not None:
        times["baseline:algos=performance"] = r["median"]
    r = _vmem_run(args, out, rows, "vdnn-all:algos=performance", profiled)
    if r is not None:
        times["vdnn-all:algos=performance"] = r["median"]
    if profiled:
        r = _vmem_run(args, out, rows, "vdnn-dyn", True)
        if r is not None:
            times["vdnn-dyn"] = r["median"]
    else:
        _failed(out, "vmem vdnn-dyn", ChildFailed("not run: it plans from a profile, and none could be made"))
    for layout, key in (("nchw", "pytorch"), ("channels_last", "pytorch channels_last")):
        try:
            t = isolated("torch_step", args.child_timeout, batch=args.batch, steps=args.steps, layout=layout)
        except ChildFailed as exc:
            _failed(out, key, exc)
            continue
        times[key] = t["median"]
        rows.append(
            (f"pytorch {t['version']} eager, {layout}", f"{t['median'] * 1e3:.1f}", "-", "cudnn.benchmark", "-")
        )
    print(f"\nVGG-16, batch {args.batch}, 224x224, FP32 (TF32 off): median step of {args.steps}")
    print(table(("run", "step ms", "plan's ms", "algorithms / choice", "plan peak"), rows))
    out["step_time"] = times
    base = times.get("baseline:algos=performance")
    if base and "pytorch" in times:
        out["verdicts"].append(
            verdict(
                "vmem baseline / PyTorch eager" + ("" if profiled else " (no profile)"),
                base / times["pytorch"],
                1.15,
                at_least=False,
            )
        )
    for policy, target in (("vdnn-all:algos=performance", 1.2), ("vdnn-dyn", 1.05)):
        if base and policy in times:
            out["verdicts"].append(
                verdict(f"{policy.split(':')[0]} / vmem baseline", times[policy] / base, target, at_least=False)
            )


# -- the GPU check's sections (tests/gpu/run.sh check): the settings users train in ----------------------
def _torch_setting(args, out, setting: str) -> tuple[str, str] | None:
    """PyTorch eager on VGG-16 in one of :data:`TORCH_SETTINGS`, in a process of its own: its table row."""
    try:
        t = isolated("torch_step", args.child_timeout, batch=args.batch, steps=args.steps, setting=setting)
    except ChildFailed as exc:
        _failed(out, f"pytorch {setting}", exc)
        return None
    out.setdefault("settings", {})[f"pytorch {setting}"] = t["median"]
    return (f"pytorch {t['version']} {setting}", f"{t['median'] * 1e3:.1f}")


def section_torch_settings(args, out):
    """PyTorch eager on VGG-16 in :data:`TORCH_SETTINGS`, each in a process of its own."""
    rows = [row for row in (_torch_setting(args, out, s) for s in TORCH_SETTINGS) if row is not None]
    print(f"\nVGG-16, batch {args.batch}: PyTorch eager, median step of {args.steps}")
    print(table(("run", "step ms"), rows))


#: vmem's runs beside each PyTorch setting: (label, precision, math, the PyTorch setting, the target ratio)
VMEM_SETTINGS = (
    ("vmem bf16", "bf16", "tf32", "amp_bf16", 1.10),
    ("vmem tf32", "fp32", "tf32", "defaults", 1.10),
    ("vmem exact", "fp32", "exact", "tf32_off", 1.30),
)


def _vmem_setting(
    args,
    out,
    label: str,
    precision: str,
    math: str,
    spans: bool = False,
    policy: str = "baseline:algos=performance",
    memory: str | None = None,
    model: str = "vgg16",
    batch: int | None = None,
    graphs: str = "off",
    conv_api: str | None = None,
) -> dict | None:
    """One vmem run of ``model`` at ``batch`` (VGG-16 at ``--batch`` unless named; ``policy`` in ``memory``,
    by default the fastest baseline in ``--memory``; its convolutions through ``conv_api``, by default
    ``--conv-api``), its profile kept per model, batch, precision, math and convolution API for the runs
    after it; its result, or None where it failed (the error kept under ``label``)."""
    batch = args.batch if batch is None else batch
    conv_api = args.conv_api if conv_api is None else conv_api
    api = "" if conv_api == "legacy" else f"-{conv_api}"  # the algorithms' names differ between the APIs
    cache = Path(args.profile_cache) / f"profile-{model}-b{batch}-{precision}-{math}{api}.pkl"
    try:
        r = isolated(
            "vmem_step",
            args.child_timeout,
            policy=policy,
            batch=batch,
            steps=args.steps,
            memory=memory or args.memory,
            profile=True,
            profile_cache=str(cache),
            conv_api=conv_api,
            nchw=args.nchw,
            precision=precision,
            math=math,
            spans=spans,
            model=model,
            graphs=graphs,
        )
    except ChildFailed as exc:
        _failed(out, label, exc)
        return None
    out.setdefault("settings", {})[label] = r["median"]
    out.setdefault("setting_runs", {})[label] = r
    print(f"{label}: {r['median'] * 1e3:.1f} ms a step (plan {r['chosen']}, peak {format_bytes(r['peak_bytes'])})")
    return r


#: vmem's TF32 run is also set beside PyTorch's defaults with its algorithm search on
ALSO_COMPARED = (("vmem tf32", "defaults_benchmark", 1.10),)


def _setting_verdicts(out) -> None:
    times = out.get("settings", {})
    pairs = [(label, setting, target) for label, _, _, setting, target in VMEM_SETTINGS] + list(ALSO_COMPARED)
    for label, setting, target in pairs:
        key, name = f"pytorch {setting}", f"{label} / PyTorch {setting}"
        if label in times and key in times and not any(v["name"] == name for v in out["verdicts"]):
            out["verdicts"].append(verdict(name, times[label] / times[key], target, at_least=False))


def section_vmem_settings(args, out):
    """vmem baseline (the fastest algorithms, from a profile) in bf16 and in FP32 with TF32."""
    for label, precision, math, _, _ in VMEM_SETTINGS[:2]:
        _vmem_setting(args, out, label, precision, math)
    _setting_verdicts(out)


def section_vmem_exact(args, out):
    """vmem baseline in exact FP32 (FMA), every span of its last step kept in the JSON."""
    label, precision, math, _, _ = VMEM_SETTINGS[2]
    _vmem_setting(args, out, label, precision, math, spans=True)
    _setting_verdicts(out)


def _pair(args, out, index: int) -> None:
    """One of :data:`VMEM_SETTINGS` beside its PyTorch setting(s): PyTorch first, then vmem (every span of
    its last step kept), the verdict at once (the check's sections: the most telling first, so that a run
    cut short still has it)."""
    label, precision, math, setting, _ = VMEM_SETTINGS[index]
    for s in [setting] + [other for name, other, _ in ALSO_COMPARED if name == label]:
        row = _torch_setting(args, out, s)
        if row is not None:
            print(f"{row[0]}: {row[1]} ms a step")
    _vmem_setting(args, out, label, precision, math, spans=True)
    _setting_verdicts(out)


def section_bf16(args, out):
    """PyTorch AMP bf16 channels-last, then vmem bf16 (every span kept)."""
    _pair(args, out, 0)


def section_tf32(args, out):
    """PyTorch's defaults (and with its algorithm search), then vmem in FP32 with TF32."""
    _pair(args, out, 1)


def section_exact(args, out):
    """PyTorch with TF32 off, then vmem in exact FP32 (FMA)."""
    _pair(args, out, 2)


def section_graphs(args, out):
    """vmem bf16 with its steps replayed as CUDA graphs, against the ``bf16`` section's run without (the same
    profile): the ratio graphs on / off, both timed (a ratio below 1 is what turns them on by default)."""
    label, precision, math, _, _ = VMEM_SETTINGS[0]
    off = out.get("settings", {}).get(label)
    if off is None:
        _vmem_setting(args, out, label, precision, math)
        off = out.get("settings", {}).get(label)
    on = _vmem_setting(args, out, f"{label} graphs", precision, math, graphs="on")
    if on is None or off is None:
        return
    replayed = sum(g == "replayed" for g in on["graphs"])
    print(f"graphs: {replayed} of {len(on['graphs'])} timed steps replayed ({', '.join(on['graphs']) or '-'})")
    out["verdicts"].append(verdict(f"{label} graphs on / off", on["median"] / off, 1.0, at_least=False))


def section_graph_api(args, out):
    """vmem bf16 with its convolutions through cuDNN's graph API (the full engine search; a convolution and the
    ReLU after it one fused graph with its bias), against the ``bf16`` section's run through the legacy API:
    the ratio graph API / legacy, both timed (a ratio below 1 is what makes the graph API the default)."""
    label, precision, math, _, _ = VMEM_SETTINGS[0]
    legacy = out.get("settings", {}).get(label)
    if legacy is None:
        _vmem_setting(args, out, label, precision, math, conv_api="legacy")
        legacy = out.get("settings", {}).get(label)
    graph = _vmem_setting(args, out, f"{label} graph API", precision, math, conv_api="graph")
    if graph is None or legacy is None:
        return
    fused = sorted({a.get("forward", "") for a in graph.get("algos", {}).values() if a})
    print(f"graph API: forward engines {', '.join(fused) or '-'}")
    out["verdicts"].append(verdict(f"{label} graph API / legacy API", graph["median"] / legacy, 1.0, at_least=False))


def section_half_memory(args, out):
    """vmem bf16 under ``auto`` in half the memory its bf16 baseline peaked at (the ``bf16`` or ``vmem_settings``
    run's peak), against that baseline's step (target at most 1.15x)."""
    base = out.get("setting_runs", {}).get("vmem bf16")
    if not base:  # nothing to halve: no bf16 section ran, or its vmem run failed (and says why)
        out.setdefault("skipped", {})["half_memory"] = "no vmem bf16 baseline run (section bf16) to halve"
        print("half_memory: skipped, no vmem bf16 baseline run (section bf16) to halve")
        return
    half = base["peak_bytes"] // 2
    r = _vmem_setting(
        args, out, "vmem bf16 auto half memory", "bf16", "tf32", spans=True, policy="auto", memory=f"{half}B"
    )
    if r is None:
        return
    ratio = r["median"] / base["median"]
    out["verdicts"].append(
        verdict("vmem bf16 auto in half the memory / vmem bf16 baseline", ratio, 1.15, at_least=False)
    )
    print(f"auto in {format_bytes(half)} (bf16): {r['median'] * 1e3:.1f} ms, {ratio:.2f}x the baseline")


def section_resnet50(args, out):
    """ResNet-50 at ``--resnet-batch`` (128): PyTorch AMP bf16 channels last against vmem bf16 (target at
    most 1.15x)."""
    batch = args.resnet_batch
    try:
        t = isolated(
            "torch_step", args.child_timeout, batch=batch, steps=args.steps, setting="amp_bf16", model="resnet50"
        )
        out.setdefault("settings", {})["pytorch amp_bf16 resnet50"] = t["median"]
    except ChildFailed as exc:  # vmem's run still goes: its figures stand alone
        _failed(out, "pytorch amp_bf16 resnet50", exc)
        t = None
    r = _vmem_setting(args, out, "vmem bf16 resnet50", "bf16", "tf32", model="resnet50", batch=batch)
    if r is None or t is None:
        return
    ratio = r["median"] / t["median"]
    out["verdicts"].append(verdict(f"ResNet-50 b{batch}: vmem bf16 / PyTorch AMP bf16", ratio, 1.15, at_least=False))
    print(
        f"ResNet-50, batch {batch}: PyTorch AMP bf16 {t['median'] * 1e3:.1f} ms, vmem bf16 {r['median'] * 1e3:.1f} ms"
    )


def section_budget_check(args, out):
    """The largest VGG-16 batch in ``--budget`` with feature maps in bf16 and in FP32: planned first (plans
    only, quick), then one step measured at the planned batch of the best policy."""
    results = out.setdefault("budget_check", {})
    for precision in ("bf16", "fp32"):
        try:
            planned = isolated(
                "vmem_largest",
                args.child_timeout,
                budget=args.budget,
                precision=precision,
                policies=["baseline", "vdnn-all"],
            )
        except ChildFailed as exc:
            _failed(out, f"vmem largest batches {precision}", exc)
            continue
        best = max(planned, key=planned.get)
        entry = results[precision] = {"planned": planned, "policy": best, "batch": planned[best]}
        if not planned[best]:
            continue
        try:
            r = isolated(
                "vmem_step",
                args.child_timeout,
                policy=best,
                batch=planned[best],
                steps=1,
                memory=args.budget,
                profile=False,
                precision=precision,
                math="tf32",
            )
            entry["measured_step_seconds"] = r["median"]
            entry["measured_peak_bytes"] = r["peak_bytes"]
        except ChildFailed as exc:
            _failed(out, f"budget step {precision}", exc)
            entry["measured"] = "failed"
        print(
            f"{precision}: {best} plans batch {planned[best]} in {args.budget}; measured: {entry.get('measured_step_seconds', 'failed')}"
        )


def section_variants(args, out):
    """vmem baseline through the convolution options the main runs did not use (of: the legacy API with
    NCHW algorithms, channels last only, the graph API), each with its own profile, against PyTorch's
    step."""
    rows, ratios = [], {}
    torch_seconds = out.get("step_time", {}).get("pytorch")
    for api, nchw in (("legacy", True), ("legacy", False), ("graph", False)):
        if _variant(api, nchw) == _variant(args.conv_api, args.nchw):
            continue
        r = _vmem_run(args, out, rows, "baseline:algos=performance", True, api, nchw)
        if r is not None and torch_seconds:
            ratios[_variant(api, nchw)] = r["median"] / torch_seconds
    print(f"\nVGG-16, batch {args.batch}: vmem baseline through the other convolution options")
    print(table(("run", "step ms", "plan's ms", "algorithms / choice", "plan peak"), rows))
    for name, ratio in ratios.items():
        print(f"vmem baseline [{name}] / PyTorch eager: {ratio:.3f}")
    out["variants"] = ratios


def section_budget(args, out):
    results = {}
    try:
        planned = isolated("vmem_largest", args.child_timeout, budget=args.budget)
        results.update({f"vmem {p}": b for p, b in planned.items()})
    except ChildFailed as exc:
        _failed(out, "vmem largest batches", exc)
    checked = "not verified"
    best = max(results, key=results.get) if results else None
    if best:
        try:  # verify: it trains at that batch
            r = isolated(
                "vmem_step",
                args.child_timeout,
                policy=best.split()[1],
                batch=results[best],
                steps=1,
                memory=args.budget,
                profile=False,
            )
            checked = f"verified by a step of {r['median']:.2f} s"
        except ChildFailed as exc:
            _failed(out, "budget verification", exc)
            checked = "NOT verified: the step failed"
    for mode in ("plain", "save_on_cpu", "checkpoint"):
        try:
            results[f"pytorch {mode}"] = isolated("torch_largest", args.child_timeout, mode=mode, budget=args.budget)[
                "largest"
            ]
        except ChildFailed as exc:
            _failed(out, f"pytorch {mode} largest batch", exc)
    print(f"\nlargest VGG-16 batch that trains in {args.budget} (vmem: {best} {checked})")
    print(table(("run", "largest batch"), sorted(results.items())))
    out["budget"] = results
    if best and results.get("pytorch plain"):
        out["verdicts"].append(
            verdict("vmem's largest batch / PyTorch plain's", results[best] / results["pytorch plain"], 2.0)
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", default="8GiB")
    parser.add_argument(
        "--memory",
        default="32GiB",
        help="vmem's arena for the step times (default 32GiB: VGG-16 at batch 64 fits under baseline, "
        "and the rest of the GPU is left to CuPy's temporaries and cuDNN)",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--resnet-batch", type=int, default=128, help="ResNet-50's batch (section resnet50)")
    parser.add_argument("--quick", action="store_true", help="skip the batch search (the longest section)")
    parser.add_argument("--json-out", help="write the results as JSON to this file (after each section)")
    parser.add_argument("--sections", help="comma-separated sections to run, in order, of: " + ", ".join(SECTIONS))
    parser.add_argument(
        "--child-timeout",
        type=float,
        default=150.0,
        metavar="SECONDS",
        help="the most a training run in its own process may take before it is stopped as stalled (default 150)",
    )
    parser.add_argument(
        "--conv-api",
        choices=("legacy", "graph"),
        default="legacy",
        help="vmem's convolutions through cuDNN's legacy API (default) or its graph API's engines",
    )
    parser.add_argument(
        "--nchw",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with the legacy API, also offer each algorithm on NCHW copies (the device's nchw=True; "
        "default on: the profile then picks, per pass, the faster of the two layouts)",
    )
    parser.add_argument(
        "--profile-cache",
        metavar="DIR",
        help="where the first vmem run keeps its profile for the others (default: a new temporary "
        "folder; one that already holds a profile of this batch is reused)",
    )
    parser.add_argument(
        "--stall-dump",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="print every thread's stack when a section has run this long, and again each time "
        "as long again (default 120; 0: never)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="without a GPU: run every section's code path (each run fails where it asks for the GPU, "
        "and the JSON says so); exit 0 if that is all that failed",
    )
    parser.add_argument("--child", choices=sorted(TASKS), help=argparse.SUPPRESS)
    parser.add_argument("--child-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _isolate.child_main(TASKS, args.child, json.loads(args.child_args), args.stall_dump)
    # stopped from outside (a time limit's SIGTERM): unwind, so that a run in progress is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.batch < 1 or args.steps < 1 or args.resnet_batch < 1 or args.child_timeout <= 10:
        parser.error("--batch, --resnet-batch and --steps must be at least 1, --child-timeout more than 10")
    args.profile_cache = args.profile_cache or tempfile.mkdtemp(prefix="vmem-bench-")
    from vmem.device.cuda import nvml, unavailable

    reason = unavailable()
    if reason and not args.dry_run:
        print(f"bench/gpu.py: {reason}", file=sys.stderr)
        return 2
    out: dict = {
        "verdicts": [],
        "errors": {},
        "machine": machine(),
        "gpu": nvml.gpus(),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "command": " ".join(["python", "bench/gpu.py", *sys.argv[1:]]),
    }
    print(f"GPU: {out['gpu']}")
    names = list(SECTIONS) if not args.sections else [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.quick and not args.sections:
        names.remove("budget")
    for name in names:
        say(f"section {name}")
        if args.stall_dump > 0:  # a stalled run still says where it was
            faulthandler.dump_traceback_later(args.stall_dump, repeat=True)
        try:
            SECTIONS[name](args, out)
        except Exception as exc:  # noqa: BLE001 - record it and go on with the next section
            traceback.print_exc()
            out["errors"][name] = f"{type(exc).__name__}: {exc}"
        faulthandler.cancel_dump_traceback_later()
        if args.json_out:  # after each section: a run cut short keeps what it measured
            Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    say("done")
    if args.dry_run and reason:  # every failure should be the GPU's absence
        other = {k: v for k, v in out["errors"].items() if not _no_gpu(v)}
        print(f"dry run: {len(names)} sections ran; {len(out['errors']) - len(other)} runs failed for want of a GPU")
        for k, v in other.items():
            print(f"dry run: {k} failed otherwise: {v}")
        return 1 if other else 0
    return 1 if out["errors"] else 0


def _no_gpu(error: str) -> bool:
    """Whether an error says there is no GPU (or no CuPy) to run on."""
    text = error.lower()
    return any(w in text for w in ("cupy", "cuda", "gpu", "nvml", "driver", "torch"))


# the training runs first (each in a process of its own), then what runs here
SECTIONS = {
    "bf16": section_bf16,
    "tf32": section_tf32,
    "exact": section_exact,
    "graphs": section_graphs,
    "graph_api": section_graph_api,
    "torch_settings": section_torch_settings,
    "vmem_settings": section_vmem_settings,
    "vmem_exact": section_vmem_exact,
    "budget_check": section_budget_check,
    "half_memory": section_half_memory,
    "resnet50": section_resnet50,
    "step_time": section_step_time,
    "budget": section_budget,
    "variants": section_variants,
    "copies": section_copies,
    "kernels": section_kernels,
    "codecs": section_codecs,
}


if __name__ == "__main__":
    sys.exit(main())
