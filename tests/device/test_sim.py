"""Simulated GPUs: spec sheets, user specs, the calibration, and what a simulated device refuses."""

from __future__ import annotations

import json

import pytest

import vmem
from vmem.device import specs
from vmem.errors import DeviceError

PUBLISHED = {"alexnet": (128, 0.081), "overfeat": (128, 0.268), "vgg_a": (64, 0.529), "googlenet": (128, 0.470)}


def test_every_spec_sheet_plans():
    net = vmem.models.get("alexnet")
    for name in ("titan-x", "gtx-1080ti", "rtx-2080ti", "v100-16gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200"):
        plan = vmem.plan(net, 64, f"sim:{name}", "baseline:algos=performance")
        assert plan.fits and plan.step_seconds > 0
    t_titan = vmem.plan(net, 128, "sim:titan-x", "baseline:algos=performance").step_seconds
    t_h100 = vmem.plan(net, 128, "sim:h100-sxm", "baseline:algos=performance").step_seconds
    assert t_h100 < t_titan / 4


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_calibrated_against_convnet_benchmarks_within_25_percent(name):
    batch, published = PUBLISHED[name]
    plan = vmem.plan(
        vmem.models.get(name), batch, "sim:titan-x", "baseline:algos=performance", memory="1000GB", oversubscribe=True
    )
    assert abs((plan.step_seconds - plan.update_seconds) / published - 1) < 0.25


def test_user_specs_from_keywords_and_files(tmp_path):
    spec = specs.register("my-gpu", base="v100-16gb", memory="32GiB")
    assert spec.memory == 32 << 30 and spec.fp32_tflops == specs.get("v100-16gb").fp32_tflops
    path = tmp_path / "gpus.json"
    path.write_text(
        json.dumps(
            {"lab-gpu": {"memory": "24GB", "fp32_tflops": 30, "memory_gbps": 900, "h2d_gbps": 20, "d2h_gbps": 20}}
        )
    )
    (loaded,) = specs.load(path)
    assert vmem.device("sim:lab-gpu").spec == loaded
    plan = vmem.plan(vmem.models.get("vgg16"), 32, "sim:lab-gpu", "vdnn-all")
    assert plan.fits and plan.step_seconds > 0
    with pytest.raises(ValueError, match="missing"):
        specs.register("half", memory="8GB")
    with pytest.raises(ValueError, match="unknown field"):
        specs.register("typo", base="h200", tflops=3)


def test_a_simulated_device_plans_but_holds_no_data():
    dev = vmem.device("sim:titan-x", memory="8GiB")
    assert dev.spec.memory == 8 << 30 and dev.pool.capacity == 8 << 30
    block = dev.pool.allocate(1 << 20, category="feature_maps")
    with pytest.raises(DeviceError, match="holds no data"):
        dev.view(block, (10,), "float32")
    with pytest.raises(DeviceError, match="unknown GPU 'titan-z'"):
        vmem.device("sim:titan-z")

    with pytest.raises(DeviceError, match="cannot train"):
        vmem.Trainer(vmem.models.get("vgg_cifar"), device="sim:titan-x")


def test_a_device_catalog_with_its_own_algorithm_names_plans():
    """A device may offer algorithms the simulator's model does not know (cuDNN's graph engines, "e12"):
    the roofline weighs them by direct FLOPs and the catalog's workspace, and the plan picks among them."""
    import dataclasses

    from vmem.planning import plan_program

    def engines(program):
        ops = []
        for op in program.ops:
            if op.kind == "conv":
                ws = {p: {"e1": 0, "e7": 64 << 20} for p in ("forward", "backward_data", "backward_filter")}
                op = dataclasses.replace(op, algorithms={p: list(names) for p, names in ws.items()}, workspace=ws)
            ops.append(op)
        return dataclasses.replace(program, ops=ops)

    program = vmem.models.get("vgg_cifar").build(32)
    spec = specs.get("h100-sxm")
    result, _ = plan_program(program, spec, "baseline:algos=performance", catalog=engines)
    assert result.fits and result.step_seconds > 0
    chosen = {a for passes in result.plan.algos.values() for a in passes.values()}
    assert chosen and chosen <= {"e1", "e7"}
    assert "e1" in chosen  # the same FLOPs with less workspace to move: the engine without workspace


def test_a_variant_of_a_known_algorithm_is_weighed_as_that_algorithm():
    """``nchw.winograd`` (the CUDA device's winograd on NCHW copies) does winograd's arithmetic with the
    catalog's workspace, so a performance plan picks it over implicit GEMM where the copies are cheap."""
    import dataclasses

    from vmem.costs import Roofline, geometry
    from vmem.device.cudnn_catalog import workspace

    program = vmem.models.get("vgg16").build(32)
    op = next(o for o in program.ops if o.kind == "conv" and o.layer.in_channels == 256)
    g = geometry(op)
    ws = {
        p: {"implicit_gemm": 0, "nchw.winograd": workspace(g, p, "winograd") + 3 * (1 << 20)}
        for p in ("forward", "backward_data", "backward_filter")
    }
    op = dataclasses.replace(op, algorithms={p: list(n) for p, n in ws.items()}, workspace=ws)
    model = Roofline(specs.get("h100-sxm"))
    assert model.op_seconds(op, "forward", "nchw.winograd") < model.op_seconds(op, "forward", "implicit_gemm")
    assert model.op_seconds(op, "forward", "nchw.winograd") >= model.op_seconds(op, "forward", "winograd")
