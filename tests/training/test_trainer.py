"""Trainer: exact accounting, reproducibility, checkpoints, rollback after errors, no leaks."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import CheckpointError, OutOfDeviceMemory
from vmem.optim import SGD, Adam


def align(n: int, a: int = 256) -> int:
    return -(-n // a) * a


def batch(shape, n, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + tuple(shape)).astype(np.float32), rng.integers(0, classes, n)


def small_net(dropout=0.0):
    layers = [
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return vmem.Sequential(*layers, nn.Linear(16 * 4 * 4, 10), input_shape=(3, 16, 16))


def weights_after(net_fn, steps, *, seed=0, policy="baseline", optimizer=None, device_opts=None, data_seed=0):
    net = net_fn()
    dev = vmem.device("cpu", memory="64MiB", **(device_opts or {}))
    with vmem.Trainer(
        net, device=dev, policy=policy, optimizer=optimizer or SGD(lr=0.05, momentum=0.9), seed=seed
    ) as trainer:
        for i in range(steps):
            x, y = batch(net.input_shape, 8, seed=data_seed + i)
            trainer.step(x, y)
    dev.close()
    return net.params


def test_baseline_peak_equals_the_programs_prediction_per_category():
    net = vmem.models.get("vgg_cifar")
    program = net.build(16)
    # What the Program predicts for network-wide allocation, category by category.
    params = [s for op in program.ops for s in op.params.values()]
    weights = sum(align(int(np.prod(s.shape)) * 4) for s in params)
    feature_maps = (
        sum(align(t.nbytes) for t in program.buffers())
        + sum(align(n) for op in program.ops for n in op.aux_nbytes.values())
        + align(16 * 10 * 4)
    )  # softmax probabilities
    largest_grad = max(t.nbytes for t in program.tensors[1:])
    gradient_maps = 2 * align(largest_grad)  # a dX/dY pair reused layer by layer
    workspace = align(
        max(
            max(op.workspace[p][a] for p in op.workspace for a in op.workspace[p] if a == "implicit")
            for op in program.ops
            if op.kind == "conv"
        )
    )
    other = align(16 * 8) + align(4)  # labels, loss
    predicted = {
        "weights": weights,
        "weight_grads": weights,
        "optimizer_state": weights,
        "feature_maps": feature_maps,
        "gradient_maps": gradient_maps,
        "workspace": workspace,
        "other": other,
    }
    dev = vmem.device("cpu", memory="512MiB")
    with vmem.Trainer(net, device=dev, policy="baseline:algos=memory", seed=0) as trainer:
        x, y = batch((3, 32, 32), 16)
        report = trainer.step(x, y)
        measured = {c: s.peak for c, s in dev.pool.stats().by_category.items() if s.peak}
        plan = trainer.plans[16]
    dev.close()
    assert measured == predicted
    assert report.peak_bytes == sum(predicted.values()) == plan.peak_bytes == 87_258_624
    assert report.average_bytes == pytest.approx(report.peak_bytes, rel=1e-12)  # allocated up front


def test_same_seed_gives_bitwise_identical_weights():
    a = weights_after(lambda: small_net(dropout=0.3), 4, seed=3)
    b = weights_after(lambda: small_net(dropout=0.3), 4, seed=3)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = weights_after(lambda: small_net(dropout=0.3), 4, seed=4)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_poisoning_freed_blocks_changes_nothing():
    a = weights_after(small_net, 3)
    b = weights_after(small_net, 3, device_opts={"poison": True})
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "optimizer", [lambda: SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), lambda: Adam(lr=1e-3)], ids=["sgd", "adam"]
)
def test_save_load_and_continue_equals_not_stopping(tmp_path, optimizer):
    straight = weights_after(lambda: small_net(dropout=0.2), 6, optimizer=optimizer())
    path = tmp_path / "ckpt.npz"
    net = small_net(dropout=0.2)
    with vmem.Trainer(net, policy="baseline", memory="64MiB", optimizer=optimizer(), seed=0) as trainer:
        for i in range(3):
            trainer.step(*batch(net.input_shape, 8, seed=i))
        trainer.save(path)
    net2 = small_net(dropout=0.2)
    with vmem.Trainer(net2, policy="baseline", memory="64MiB", optimizer=optimizer(), seed=99) as trainer:
        trainer.load(path)
        assert trainer.steps_done == 3
        for i in range(3, 6):
            trainer.step(*batch(net2.input_shape, 8, seed=i))
    assert all(np.array_equal(straight[k], net2.params[k]) for k in straight)


def test_bad_checkpoints_raise_and_leave_the_model_untouched(tmp_path):
    net = small_net()
    with vmem.Trainer(net, policy="baseline", memory="64MiB", seed=0) as trainer:
        trainer.step(*batch(net.input_shape, 8))
        good = tmp_path / "good.npz"
        trainer.save(good)
        trainer.step(*batch(net.input_shape, 8, seed=1))
        trainer.sync()
        before = {k: v.copy() for k, v in net.params.items()}
        steps = trainer.steps_done

        truncated = tmp_path / "truncated.npz"
        truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        with pytest.raises(CheckpointError, match="truncated.npz"):
            trainer.load(truncated)
        with pytest.raises(CheckpointError, match="cannot read"):
            trainer.load(tmp_path / "missing.npz")

        other = vmem.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.Flatten(),
            nn.Linear(4 * 16 * 16, 10),
            input_shape=(3, 16, 16),
            name="sequential",
        )
        with vmem.Trainer(other, policy="baseline", memory="64MiB", seed=0) as t2:
            mismatched = tmp_path / "other.npz"
            t2.save(mismatched)
        with pytest.raises(CheckpointError, match="does not match"):
            trainer.load(mismatched)
        with vmem.Trainer(small_net(), policy="baseline", memory="64MiB", optimizer=Adam(), seed=0) as t3:
            adam = tmp_path / "adam.npz"
            t3.save(adam)
        with pytest.raises(CheckpointError, match="optimizer is 'Adam'"):
            trainer.load(adam)

        trainer.sync()
        assert trainer.steps_done == steps
        assert all(np.array_equal(before[k], net.params[k]) for k in before)
        trainer.step(*batch(net.input_shape, 8, seed=2))  # still trains


def test_a_plan_that_does_not_fit_is_refused_with_a_remedy():
    net = vmem.models.get("vgg_cifar")
    with vmem.Trainer(net, policy="baseline", memory="32MiB", seed=0) as trainer:
        with pytest.raises(OutOfDeviceMemory, match="needs .* at batch 64") as info:
            trainer.step(*batch((3, 32, 32), 64))
        assert info.value.requested == trainer.plans[64].peak_bytes
        assert trainer.device.pool.stats().in_use == trainer.device.pool.stats().by_category["weights"].in_use * 3


def test_out_of_memory_during_a_step_leaves_the_pool_as_it_was():
    net = small_net()
    dev = vmem.device("cpu", memory="4MiB")
    with vmem.Trainer(net, device=dev, seed=0) as trainer:
        x, y = batch(net.input_shape, 32)
        trainer.step(x, y)
        dev.pool.reclaim(wait=True)  # the step's freed blocks back to everyone, coalesced
        blocker = dev.pool.allocate(dev.pool.stats().largest_free - 200_000, category="other")
        before = dev.pool.snapshot()
        with pytest.raises(OutOfDeviceMemory):
            trainer.step(x, y)
        dev.pool.reclaim(wait=True)
        assert dev.pool.snapshot() == before
        dev.pool.free(blocker)
        trainer.step(x, y)
    dev.close()


def test_errors_in_layers_surface_and_the_pool_recovers():
    class Broken(nn.ReLU):
        kind = "broken"

        def forward(self, ctx, xs, y):
            raise FloatingPointError("broken layer")

    net = vmem.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), Broken(), nn.Flatten(), nn.Linear(4 * 16 * 16, 10), input_shape=(3, 16, 16)
    )
    dev = vmem.device("cpu", memory="16MiB")
    with vmem.Trainer(net, device=dev, seed=0) as trainer:
        in_use = dev.pool.stats().in_use if trainer.session._params else None
        with pytest.raises(FloatingPointError, match="broken layer"):
            trainer.step(*batch(net.input_shape, 4))
        dev.pool.reclaim(wait=True)
        assert dev.pool.stats().in_use == sum(
            s.in_use
            for c, s in dev.pool.stats().by_category.items()
            if c in ("weights", "weight_grads", "optimizer_state")
        )
        assert in_use is None
    dev.close()


def test_no_leaks_over_many_steps_and_after_close():
    net = small_net()
    dev = vmem.device("cpu", memory="16MiB")
    start = dev.pool.stats().in_use
    with vmem.Trainer(net, device=dev, seed=0) as trainer:
        x, y = batch(net.input_shape, 8)
        trainer.step(x, y)
        boundary = dev.pool.stats().in_use
        for _ in range(50):
            trainer.step(x, y)
            assert dev.pool.stats().in_use == boundary
        trainer.evaluate(vmem.data.Dataset(x, y, 10), batch_size=3)
        assert dev.pool.stats().in_use == boundary
    dev.pool.reclaim(wait=True)
    assert dev.pool.stats().in_use == start
    assert len(dev.pool.snapshot()["blocks"]) == 1
    dev.close()


def test_fit_learns_and_evaluate_reports_accuracy():
    train, val = vmem.data.synthetic(n=400, input_shape=(3, 16, 16), seed=1)
    net = small_net()
    with vmem.Trainer(net, policy="baseline", memory="64MiB", optimizer=SGD(lr=0.01, momentum=0.9), seed=0) as trainer:
        history = trainer.fit(train, epochs=5, val=val, batch_size=16, progress=False)
    assert history.last.train_loss < history.epochs[0].train_loss
    assert history.last.val_accuracy > 0.8
    assert history.last.peak_bytes > 0 and history.last.step_seconds > 0


def test_inputs_are_checked():
    net = small_net()
    with vmem.Trainer(net, policy="baseline", memory="64MiB") as trainer:
        with pytest.raises(vmem.errors.ShapeError, match=r"takes \(N, 3, 16, 16\)"):
            trainer.step(np.zeros((2, 3, 8, 8), np.float32), np.zeros(2, int))
        with pytest.raises(ValueError, match="unknown policy 'vdnn'"):
            vmem.Trainer(net, policy="vdnn")


def test_num_parameters_counts_trainable_values_not_state():
    """Conv and linear weights and biases, batch norm's scale and shift; not its running statistics."""
    net = vmem.Sequential(
        vmem.nn.Conv2d(3, 8, 3, padding=1),
        vmem.nn.BatchNorm2d(8),
        vmem.nn.ReLU(),
        vmem.nn.Flatten(),
        vmem.nn.Linear(8 * 4 * 4, 5),
        input_shape=(3, 4, 4),
    )
    want = (3 * 9 * 8 + 8) + (8 + 8) + (128 * 5 + 5)
    with vmem.Trainer(net, device="cpu", memory="16MiB", policy="baseline") as t:
        assert t.num_parameters() == net.num_parameters() == want


def test_synthetic_data_is_drawn_in_slices_with_the_values_of_one_draw():
    """Made a slice at a time (so that Ctrl-C stops it), the same images as one draw of the noise."""
    train, val = vmem.data.synthetic(n=300, input_shape=(3, 64, 64), seed=3)
    rng = np.random.default_rng(3)
    patterns = rng.standard_normal((10, 3, 64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 300)
    x = patterns[y] + rng.standard_normal((300, 3, 64, 64)).astype(np.float32) * 1.5
    both = np.concatenate([train.x, val.x])
    assert {bytes(r) for r in both.reshape(300, -1)} == {bytes(r) for r in x.reshape(300, -1)}


def test_an_image_size_the_machine_cannot_hold_is_refused_before_anything_is_allocated():
    with pytest.raises(ValueError, match=r"digits at 100000x100000 would take .* of memory .* free"):
        vmem.data.digits(image_size=100000)


def test_an_optimizer_given_by_name_is_refused_at_once_with_the_way_to_give_one():
    with pytest.raises(TypeError, match=r"optimizer='sgd': give an optimizer object, e.g. vmem.optim.SGD"):
        vmem.Trainer(vmem.models.get("digits_vgg"), optimizer="sgd")


def test_a_second_thread_stepping_the_same_trainer_is_refused_clearly():
    """Two threads stepping one Trainer: the second is refused at once, naming the cause (it met
    OutOfPinnedMemory from the first step's reservation)."""
    import threading

    net = vmem.models.get("digits_cnn")
    x = np.random.default_rng(0).standard_normal((8,) + net.input_shape).astype(np.float32)
    y = np.arange(8) % 10
    with vmem.Trainer(net, seed=0) as trainer:
        trainer.step(x, y)
        ex = trainer.session.executor(8, True)
        inside, go_on = threading.Event(), threading.Event()
        real = ex._run

        def slow(*args, **kwargs):
            inside.set()
            go_on.wait(10)
            return real(*args, **kwargs)

        ex._run = slow
        first = threading.Thread(target=trainer.step, args=(x, y))
        first.start()
        try:
            assert inside.wait(10)
            with pytest.raises(RuntimeError, match="another thread is running a step"):
                trainer.step(x, y)
        finally:
            go_on.set()
            first.join(10)
        ex._run = real
        assert trainer.step(x, y).loss > 0  # and the next step runs


def test_synthetic_data_is_never_one_long_numpy_call(monkeypatch):
    """Ctrl-C is only seen between NumPy calls: no draw may cover the whole dataset (1024 images at 224x224
    were one call of 2.5 s)."""
    real = np.random.default_rng
    sizes = []

    class Recorder:
        def __init__(self, seed):
            self.rng = real(seed)

        def standard_normal(self, size):
            sizes.append(int(np.prod(size)))
            return self.rng.standard_normal(size)

        def __getattr__(self, name):
            return getattr(self.rng, name)

    monkeypatch.setattr(np.random, "default_rng", Recorder)
    vmem.data.synthetic(n=256, input_shape=(3, 224, 224))
    assert max(sizes) <= 1 << 22 and len(sizes) > 10
