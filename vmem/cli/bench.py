"""``vmem bench``: microbenchmarks of the host-device link, through a codec or not."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..units import format_bytes, parse_bytes
from .options import host_memory, positive_float, positive_int

__all__ = ["cmd_bench", "add_parser"]


def cmd_bench(args: argparse.Namespace) -> int:
    from ..benchmarks import DEFAULT_SIZES, bandwidth
    from ..device import device as make_device

    options: dict[str, Any] = {"memory": args.memory or "1GiB"}
    if args.pcie_gbps:
        options["pcie_gbps"] = args.pcie_gbps
    if args.codec:
        from .. import codecs

        codecs.get(args.codec)  # a clear error before the device starts
        try:
            densities = [float(d) for d in args.density.split(",")]
        except ValueError:
            densities = [-1.0]
        if any(not 0 <= d <= 1 for d in densities):
            raise ValueError(
                f"--density {args.density!r}: comma-separated fractions of nonzeros from 0 to 1, e.g. 0.1,0.5,0.9"
            )
    sizes = args.sizes.split(",") if args.sizes else (["4MiB", "16MiB", "64MiB"] if args.codec else list(DEFAULT_SIZES))
    largest = max(parse_bytes(size.strip(), name="--sizes") for size in sizes)
    host = host_memory()
    if host is not None and 4 * largest > host:  # a source and a destination, pinned and pageable
        raise ValueError(
            f"--sizes: a copy of {format_bytes(largest)} needs about {format_bytes(4 * largest)} of host memory "
            f"(its buffers on both sides), more than this machine's {format_bytes(host)}"
        )
    dev = make_device(args.device, **options)
    try:
        if args.codec:
            return _bench_codec(dev, args, sizes, densities)
        rows = bandwidth(dev, sizes, rounds=args.rounds, progress=not args.json)
    finally:
        dev.close()
    if args.json:
        print(
            json.dumps(
                {"bench": "bandwidth", "device": args.device, "pcie_gbps": args.pcie_gbps, "rows": rows}, indent=2
            )
        )
        return 0
    print(
        f"host-device copy bandwidth on {args.device}"
        + (f", link {args.pcie_gbps:g} GB/s" if args.pcie_gbps else "")
        + " (GB/s, best of rounds)"
    )
    print(f"{'size':>12}  {'d2h pinned':>10}  {'h2d pinned':>10}  {'d2h pageable':>12}  {'h2d pageable':>12}")
    for r in rows:
        print(
            f"{format_bytes(r['bytes']):>12}  {r['d2h_pinned_gbps']:10.2f}  {r['h2d_pinned_gbps']:10.2f}  "
            f"{r['d2h_pageable_gbps']:12.2f}  {r['h2d_pageable_gbps']:12.2f}"
        )
    return 0


def _bench_codec(dev: Any, args: argparse.Namespace, sizes: list[str], densities: list[float]) -> int:
    from ..benchmarks import codec_bandwidth

    rows = codec_bandwidth(dev, args.codec, sizes, densities, rounds=args.rounds, progress=not args.json)
    if args.json:
        print(
            json.dumps(
                {
                    "bench": "bandwidth",
                    "device": args.device,
                    "pcie_gbps": args.pcie_gbps,
                    "codec": args.codec,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"offload through {args.codec} on {args.device}"
        + (f", link {args.pcie_gbps:g} GB/s" if args.pcie_gbps else "")
        + ": effective GB/s (uncompressed bytes per second, codec included) against a plain pinned copy"
    )
    print(
        f"{'size':>10}  {'density':>7}  {'ratio':>6}  {'link d2h':>8}  {'offload':>8}  {'link h2d':>8}  {'prefetch':>8}"
    )
    for r in rows:
        print(
            f"{format_bytes(r['bytes']):>10}  {r['density']:7.2f}  {r['bytes'] / r['encoded_bytes']:6.2f}  "
            f"{r['link_d2h_gbps']:8.2f}  {r['offload_gbps']:8.2f}  {r['link_h2d_gbps']:8.2f}  {r['prefetch_gbps']:8.2f}"
        )
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="microbenchmarks (bandwidth)",
        description="bandwidth: device-to-host and host-to-device copy throughput over sizes, "
        "pinned against pageable host buffers; with --codec, the effective bandwidth of offloads "
        "and prefetches through a codec on ReLU-like activations of several densities.",
    )
    p.add_argument("which", choices=("bandwidth",))
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory", default=None, help="device memory (default 1GiB)")
    p.add_argument(
        "--pcie-gbps",
        type=positive_float,
        help="throttle the CPU device's link to this many GB/s (more than 0; leave it out for an unthrottled link)",
    )
    p.add_argument("--sizes", help="comma-separated sizes (default 64KiB to 256MiB)")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--codec", help="transfer through this codec (zvc, ssdc, fp16, fp8, ...; see vmem.codecs)")
    p.add_argument(
        "--density",
        default="0.1,0.3,0.5,0.7,0.9",
        help="with --codec: fractions of nonzeros, comma-separated (default 0.1,...,0.9)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
