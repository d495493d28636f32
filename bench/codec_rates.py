"""Encode+decode throughput of each codec on the CPU, against a NumPy copy of the same data, same run.

The data are ReLU outputs (about half zeros) of 64 MiB by default, shaped (N, 64, 64, 64) and stored channels
last, as the executor encodes them (per-channel and per-patch codecs read that layout). 64 MiB is larger than
the last-level cache, as the feature maps that are offloaded or encoded are (at 16 MiB the copy runs from
cache and is up to twice as fast, while the codecs allocate their outputs). Throughput counts the uncompressed
bytes: size / (encode seconds + decode seconds), best of rounds; the ratio divides by the throughput of one
numpy.copyto of the same array. Compression ratios are printed too.

Targets (issue 6): at least 0.5x a copy for binarize and dpr, at least 0.25x for zvc and ssdc.

    python bench/codec_rates.py [--size 64MiB] [--density 0.5] [--json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from _report import emit, table, verdict

from vmem import codecs, parse_bytes
from vmem.benchmarks import best_seconds, relu_activations
from vmem.codecs import native

SPECS = [
    "binarize",
    "dpr:format=fp16",
    "dpr:format=fp10",
    "dpr:format=fp8",
    "zvc",
    "ssdc",
    "fixed:bits=8",
    "fixed:bits=4",
    "patch2",
]
TARGETS = {
    "binarize": 0.5,
    "dpr:format=fp16": 0.5,
    "dpr:format=fp10": 0.5,
    "dpr:format=fp8": 0.5,
    "zvc": 0.25,
    "ssdc": 0.25,
}


def best(fn, rounds: int) -> float:
    return best_seconds(fn, rounds, warmup=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--density", type=float, default=0.5, help="fraction of nonzeros (default 0.5)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n = parse_bytes(args.size, name="--size") // 4
    shape = (max(1, n // 64**3), 64, 64, 64)  # (N, H, W, C): stored channels last, as devices store feature maps
    x = relu_activations(int(np.prod(shape)), args.density).reshape(shape)
    dst = np.empty_like(x)
    copy_gbps = x.nbytes / best(lambda: np.copyto(dst, x), args.rounds) / 1e9
    rows, results, targets = [], {}, []
    for spec in SPECS:
        c = codecs.get(spec)
        enc = codecs.encode_channels_last(c, x)
        out = np.empty_like(x)
        seconds = best(lambda: codecs.encode_channels_last(c, x), args.rounds) + best(
            lambda: codecs.decode_channels_last(c, enc, out), args.rounds
        )
        gbps = x.nbytes / seconds / 1e9
        results[spec] = {"gbps": gbps, "ratio_to_copy": gbps / copy_gbps, "compression": x.nbytes / enc.nbytes}
        rows.append((spec, gbps, gbps / copy_gbps, x.nbytes / enc.nbytes))
    print(
        f"{x.nbytes / 2**20:.0f} MiB of ReLU output at density {args.density:g}; numpy copy {copy_gbps:.2f} GB/s; "
        f"native kernels: {'yes' if native.lib is not None else 'no (NumPy references)'}"
    )
    print(table(["codec", "enc+dec GB/s", "x copy", "compression"], rows))
    for spec, target in TARGETS.items():
        targets.append(verdict(f"{spec} throughput / copy", results[spec]["ratio_to_copy"], target))
    return emit(
        {
            "bench": "codecs",
            "bytes": x.nbytes,
            "density": args.density,
            "copy_gbps": copy_gbps,
            "results": results,
            "targets": targets,
        },
        args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
