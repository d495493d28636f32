"""NVML without a GPU: CUDA's numbering told from NVML's (no CuPy), ``vmem devices`` through a fake NVML,
and readings sampled off the step's path by a thread that never holds a step up and stops on close."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import pytest

from vmem.cli import main
from vmem.device.cuda import nvml


def _rows(*specs):
    return [
        {"nvml_index": i, "gpu": gpu, "pci_bus_id": bus, "uuid": f"GPU-{uuid}"}
        for i, (gpu, bus, uuid) in enumerate(specs)
    ]


SAME = _rows(
    ("H100", "00000000:1B:00.0", "aaaa"), ("H100", "00000000:3B:00.0", "bbbb"), ("H100", "00000000:5B:00.0", "cccc")
)
MIXED = _rows(("A100", "00000000:1B:00.0", "aaaa"), ("H100", "00000000:3B:00.0", "bbbb"))


@pytest.mark.parametrize(
    "rows, env, want",
    [
        (SAME, {}, {0: 0, 1: 1, 2: 2}),
        (SAME, {"CUDA_VISIBLE_DEVICES": "2,0"}, {2: 0, 0: 1}),
        (SAME, {"CUDA_VISIBLE_DEVICES": "GPU-bb"}, {1: 0}),
        (SAME, {"CUDA_VISIBLE_DEVICES": "1,7,0"}, {1: 0}),  # CUDA ignores the list from an entry that names none
        (SAME, {"CUDA_VISIBLE_DEVICES": ""}, {}),
        (MIXED, {}, {}),  # fastest first: not told without CUDA
        (MIXED, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, {0: 0, 1: 1}),
    ],
)
def test_cuda_numbering_from_nvml(rows, env, want):
    assert nvml.cuda_order(rows, env) == want


class _FakeNvml(types.SimpleNamespace):
    """pynvml's calls that vmem makes, over two GPUs (given in NVML's PCI order)."""

    def __init__(self, names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")):
        super().__init__(calls=0)
        self.names = names

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=f"00000000:{0x1B + 0x20 * h:02X}:00.0".encode())

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}{h}{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=80 << 30, used=(h + 1) << 30, free=(79 - h) << 30)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self.calls += 1
        return 100

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16


def test_devices_lists_gpus_by_cuda_index_without_cupy(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # any import of CuPy fails
    monkeypatch.setattr(nvml, "_load", lambda: (_FakeNvml(), None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpus = [line for line in lines if line.startswith(("cuda:", "nvml:"))]
    assert gpus[0].startswith("cuda:0") and "00000000:3B:00.0" in gpus[0]  # the second GPU is CUDA's only one
    assert gpus[1].startswith("nvml:0") and any("CUDA_VISIBLE_DEVICES" in line for line in lines)


def test_listing_devices_imports_no_cupy():
    code = "import sys; from vmem.cli import main; main(['devices', '--json']); print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_the_sampler_answers_at_once_and_its_thread_stops_on_close():
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.05)  # NVML's PCIe counters take about 20 ms each
        return {"used_bytes": 1}

    before = threading.active_count()
    sampler = nvml.Sampler(slow, period=0.01)
    t0 = time.perf_counter()
    assert sampler.latest() == {}  # nothing yet, and no wait for it
    assert time.perf_counter() - t0 < 0.03
    started.wait(5)
    deadline = time.perf_counter() + 5
    while sampler.latest() != {"used_bytes": 1} and time.perf_counter() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    assert sampler.latest() == {"used_bytes": 1} and time.perf_counter() - t0 < 0.01
    sampler.close()
    assert threading.active_count() == before
    assert sampler.latest() == {"used_bytes": 1}  # closed: the last reading, no new thread
    assert threading.active_count() == before
