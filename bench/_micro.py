"""The GPU bench's small measures (bench/gpu.py sections ``copies``, ``kernels``, ``codecs``): pinned copies
through vmem against raw ``cudaMemcpyAsync``, the encoding kernels' throughput, offload through each codec."""

from __future__ import annotations

import numpy as np

from _report import table, verdict

import vmem


def section_copies(args, out):
    import cupy

    from vmem.benchmarks import bandwidth

    n = 256 << 20
    with vmem.device("cuda:0", memory="2GiB", pinned_memory="512MiB") as dev:
        row = bandwidth(dev, [n], rounds=5)[0]
    dst, host = cupy.empty(n, cupy.uint8), cupy.cuda.alloc_pinned_memory(n)
    stream = cupy.cuda.Stream(non_blocking=True)
    raw = {}
    for name, kind, a, b in (("d2h", 2, host.ptr, dst.data.ptr), ("h2d", 1, dst.data.ptr, host.ptr)):
        best = 0.0
        for _ in range(5):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(4):
                cupy.cuda.runtime.memcpyAsync(a, b, n, kind, stream.ptr)
            end.record(stream)
            end.synchronize()
            best = max(best, 4 * n / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9)
        raw[name] = best
    rows = [
        (d, f"{row[f'{d}_pinned_gbps']:.1f}", f"{raw[d]:.1f}", f"{row[f'{d}_pinned_gbps'] / raw[d]:.3f}")
        for d in ("d2h", "h2d")
    ]
    print("\npinned copies of 256 MiB: vmem's device against raw cudaMemcpyAsync (GB/s)")
    print(table(("direction", "vmem", "raw", "ratio"), rows))
    out["copies"] = {"vmem": row, "raw": raw}
    out["verdicts"].append(
        verdict(
            "pinned copies / raw cudaMemcpyAsync (worse direction)",
            min(row["d2h_pinned_gbps"] / raw["d2h"], row["h2d_pinned_gbps"] / raw["h2d"]),
            0.9,
        )
    )


def section_kernels(args, out):
    import cupy

    n = 64 << 20
    rng = np.random.default_rng(0)
    x = cupy.asarray(np.maximum(rng.standard_normal(n), 0).astype(np.float32))
    rows, res = [], {}
    with vmem.device("cuda:0", memory="1GiB") as dev:
        k = dev.kernels
        cases = {
            "binarize_encode": (-(-n // 8), (x, cupy.empty(-(-n // 8), cupy.uint8), np.int64(n))),
            "dpr16_encode": (n, (x.view(cupy.uint32), cupy.empty(n, cupy.uint16), np.int64(n))),
            "dpr8_encode": (n, (x.view(cupy.uint32), cupy.empty(n, cupy.uint8), np.int64(n))),
            "zvc_mask": (
                -(-n // 32),
                (
                    x.view(cupy.uint32),
                    cupy.empty(-(-n // 32), cupy.uint32),
                    cupy.empty(-(-n // 32), cupy.uint32),
                    np.int64(n),
                ),
            ),
        }
        for name, (threads, kargs) in cases.items():
            k.launch(name, threads, *kargs)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(10):
                k.launch(name, threads, *kargs)
            end.record()
            end.synchronize()
            res[name] = 10 * x.nbytes / (cupy.cuda.get_elapsed_time(start, end) / 1e3) / 1e9
            rows.append((name, f"{res[name]:.0f}"))
    print("\nencoding kernels on the GPU, 256 MiB of float32 ReLU output (GB/s of input)")
    print(table(("kernel", "GB/s"), rows))
    out["kernels_gbps"] = res


def section_codecs(args, out):
    """Offload and prefetch through each GPU codec (encode or decode included) against the plain pinned
    copy of the same bytes, at the densities of ReLU outputs."""
    from vmem.benchmarks import codec_bandwidth

    rows, res = [], {}
    with vmem.device("cuda:0", memory="2GiB", pinned_memory="1GiB") as dev:
        for spec in ("zvc", "ssdc", "fp16", "fp8"):
            for row in codec_bandwidth(dev, spec, sizes=("64MiB",), densities=(0.1, 0.5, 0.9), rounds=3):
                res.setdefault(spec, []).append(row)
                rows.append(
                    (
                        spec,
                        f"{row['density']:.1f}",
                        f"{row['encoded_bytes'] / row['bytes']:.2f}",
                        f"{row['offload_gbps']:.1f}",
                        f"{row['prefetch_gbps']:.1f}",
                        f"{row['link_d2h_gbps']:.1f}",
                        f"{row['link_h2d_gbps']:.1f}",
                    )
                )
    print("\noffload through a codec on the GPU, 64 MiB of float32 ReLU output (GB/s of the raw tensor)")
    print(table(("codec", "density", "size", "offload", "prefetch", "copy d2h", "copy h2d"), rows))
    out["codecs"] = res
