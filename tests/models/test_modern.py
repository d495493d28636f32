"""The zoo's networks as the common model libraries build them, written with vmem's layers: a ViT and a
MobileNetV3-Small, their parameters counted as timm counts its own, trained, planned and exported."""

from __future__ import annotations

import numpy as np
import pytest

import vmem


#: parameters at these settings: what timm's own networks hold there (ViT: patch 4, dim 64, depth 4, heads 4,
#: MLP 128, 10 classes, at 32x32; mobilenetv3_small_100 has 2,542,856 at 1000 classes, 1,528,106 at 10)
PARAMS = {"vit": 142_026, "mobilenet_v3": 1_528_106}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_modern_network_trains_plans_and_exports(name, tmp_path):
    net = vmem.models.get(name)
    assert net.input_shape == (3, 32, 32)
    net.init(seed=0)
    assert net.num_params() == PARAMS[name]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.Trainer(net, seed=0, optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9)) as trainer:
        losses = [trainer.step(x, y).loss for _ in range(5)]
        want = trainer.predict(x)
    assert losses[-1] < 0.5 * losses[0], losses  # one batch learned
    assert vmem.plan(net, 64, "sim:h100-sxm", "auto", memory="1GiB").fits
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    vmem.onnx.save(net, tmp_path / f"{name}.onnx")
    got = ort.InferenceSession(str(tmp_path / f"{name}.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_modern_networks_refuse_settings_that_do_not_fit():
    with pytest.raises(ValueError, match="image_size=30 is not a multiple of patch=4"):
        vmem.models.get("vit", image_size=30)
    with pytest.raises(ValueError, match="dim=64 does not split into 5 heads"):
        vmem.models.get("vit", heads=5)
    with pytest.raises(ValueError, match="image_size=48 is not a multiple of 32"):
        vmem.models.get("mobilenet_v3", image_size=48)
