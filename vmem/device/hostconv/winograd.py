"""Winograd F(2x2, 3x3): the CPU's fastest algorithm for 3x3 stride-1 convolutions (Lavin and Gray, 2016).

Each 2x2 block of outputs is computed from a 4x4 tile of the input: the tile is transformed
(``V = B^T d B``), multiplied element by element with the transformed filters (``U = G g G^T``) and
summed over channels, then transformed back (``Y = A^T M A``). Over channels the element-wise products
are 16 GEMMs (one per transformed position): ``M[xi] = V[xi] @ U[xi]``, tiles x in-channels times
in-channels x out-channels, with 16 multiply-adds per 4 outputs instead of 36, so 2.25x fewer than
im2col's GEMM for the same result up to float32 rounding.

The three passes, channels last:

* forward: V from x, M = V U^T, y = A^T M A + bias;
* backward-data: the forward pass of dy with the filters flipped and transposed, padded by ``2 - p``
  (a stride-1 convolution's transposed convolution);
* backward-filter: V from x, M from dy by the adjoint of the output transform (``A g A^T``), then
  ``dU = M^T V`` summed over tiles and ``dW = G^T dU G``: the exact gradient of the forward computation.

The tiles of a batch are processed a few images at a time (a chunk), with the transformed values in 16
planes of the workspace, each lane with its own planes; as im2col's, forward and backward-data chunks
are pulled by the lanes as they finish (``ops.pull``, :mod:`vmem.nn.ops`) and backward-filter's are dealt
(each lane sums its own filter gradient, added in lane order), so the results do not depend on how the
lanes run. Small maps (a few tiles an image, where each lane would have one chunk) go as one chunk of the
whole batch instead: its transforms split by ranges of tiles and its 16 GEMMs by planes, each GEMM over
every tile of the batch (longer products, no partial gradients to add, pieces for a slowed core to leave
to the other). The transforms are C (``vmem/csrc/winograd.c``, in ``vmem._native``) on float32; in float64, or
without the native build, the NumPy references below do the same arithmetic (the filter transforms in
the same order of operations, so bit for bit; the tile transforms up to rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...nn import lanes as _lanes
from ...nn.ops import HostOps
from .arrays import _image_chunks

__all__ = ["applies", "worthwhile", "layout", "forward", "backward_data", "backward_filter"]

#: The pieces run in turn: for the transforms called on their own.
_IN_TURN = HostOps()

try:
    from ..._native import ffi as _ffi, lib as _lib  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the install
    _ffi = _lib = None
if _lib is not None and not hasattr(_lib, "vmem_wg_input"):  # pragma: no cover - an older build
    _ffi = _lib = None

#: The transforms of F(2x2, 3x3): inputs (B^T), filters (G), outputs (A^T).
BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
AT = ((1, 1, 1, 0), (0, 1, -1, -1))
_GT = tuple(zip(*G))  # G^T, (3, 4): the filter gradient's transform

#: Values of a chunk's planes (V and M together) that a chunk aims at (4 MiB in float32) ...
_CHUNK_VALUES = 1 << 20
#: ... with at least this many tiles, so that each of its 16 GEMMs stays efficient.
_CHUNK_MIN_TILES = 256
#: Smallest channel count for which the catalog offers Winograd: with fewer (a first layer's 3 colours)
#: its 16 GEMMs are too thin to beat im2col's one.
_MIN_CHANNELS = 16


def applies(kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]) -> bool:
    """Whether F(2x2, 3x3) computes this convolution: a 3x3 kernel, stride 1, padding at most 2."""
    return kernel == (3, 3) and stride == (1, 1) and max(padding) <= 2


def worthwhile(in_channels: int, out_channels: int) -> bool:
    """Whether the catalog offers it (a shape-only rule; see :data:`_MIN_CHANNELS`)."""
    return min(in_channels, out_channels) >= _MIN_CHANNELS


def _tiles(ho: int, wo: int) -> tuple[int, int]:
    return -(-ho // 2), -(-wo // 2)


def _plane_stride(tiles: int, channels: int) -> int:
    """Values from one plane to the next: a whole number of 64-byte lines (in float32), plus one, so that
    the 16 planes of a tile do not share a cache set (see vmem/csrc/winograd.c)."""
    return -(-tiles * channels // 16) * 16 + 16


def layout(
    n: int, c: int, h: int, w: int, k: int, ho: int, wo: int, pass_: str, ways: int
) -> tuple[int, dict[str, int], list[dict[str, int]]]:
    """A pass's chunking and workspace: (images per chunk, shared slots, each lane's slots), each slot a
    number of values.

    Shared: the transformed filters ``u`` (16 planes of k x c) and their half-transformed temporary
    ``t`` (12 x k x c; backward-filter's ``t`` holds dW's half-transformed gradient). Each lane: the
    planes of its chunk, ``v`` (16 of tiles x in-channels) and ``m`` (16 of tiles x out-channels);
    backward-filter adds the lane's gradient of the transformed filters ``du`` (16 planes of k x c)
    and, where the lane has several chunks, a product to add in (``tmp``). Every set of planes is laid
    out by :func:`_plane_stride`.

    Where the lanes would have a chunk each (small maps: a few tiles an image), the whole batch is one
    chunk instead, its ``v``, ``m`` (and backward-filter's ``du``) shared, and no lane has slots: the
    lanes split its transforms by tiles and its GEMMs by planes (:func:`_by_planes`), so a slowed core
    takes fewer pieces, each GEMM runs over every tile, and backward-filter sums no partial gradients."""
    cin, cout = (k, c) if pass_ == "backward_data" else (c, k)
    th, tw = _tiles(h, w) if pass_ == "backward_data" else _tiles(ho, wo)
    per = th * tw
    tiles = max(_CHUNK_MIN_TILES, _CHUNK_VALUES // (16 * (cin + cout)))
    nb = min(n, max(1, -(-tiles // per)), -(-n // ways))
    chunks = -(-n // nb)
    filters = 16 * _plane_stride(k, c)
    shared = {"t": 12 * k * c}
    if pass_ != "backward_filter":
        shared["u"] = filters
    if ways > 1 and chunks <= ways:  # a chunk a lane: one of the whole batch, split by tiles and planes
        shared["v"] = 16 * _plane_stride(n * per, cin)
        shared["m"] = 16 * _plane_stride(n * per, cout)
        if pass_ == "backward_filter":
            shared["du"] = filters
        return n, shared, []
    lanes = []
    for lane in range(min(ways, chunks)):
        slots = {"v": 16 * _plane_stride(nb * per, cin), "m": 16 * _plane_stride(nb * per, cout)}
        if pass_ == "backward_filter":
            slots["du"] = filters
            if len(range(lane, chunks, ways)) > 1:
                slots["tmp"] = filters
        lanes.append(slots)
    return nb, shared, lanes


# -- filter transforms (NumPy, element-wise into workspace slots) --------------------------------------
def _mix(matrix: Any, srcs: list[np.ndarray], outs: list[np.ndarray]) -> None:
    """``outs[r] = sum_i matrix[r][i] * srcs[i]`` for each row r, with no temporaries: the coefficients
    are 0, +-1 and +-1/2, so each row is sums and differences, halved where the halves are."""
    for row, out in zip(matrix, outs):
        started = False
        for magnitude in sorted({abs(a) for a in row if a}, key=lambda m: m == 1):  # halves first
            for a, src in zip(row, srcs):
                if abs(a) != magnitude:
                    continue
                if not started:
                    if a > 0:
                        np.copyto(out, src)
                    else:
                        np.negative(src, out=out)
                    started = True
                else:
                    (np.add if a > 0 else np.subtract)(out, src, out=out)
            if magnitude != 1:
                np.multiply(out, magnitude, out=out)


def filter_transform(
    wt: np.ndarray, u: np.ndarray, t: np.ndarray, flip: bool = False, ops: HostOps = _IN_TURN
) -> np.ndarray:
    """``u[a, b] = (G g G^T)[a, b]`` for every filter g of ``wt`` (k, 3, 3, c), as 16 planes of k x c
    (``u``: :func:`layout`'s slot; ``t``: 12*k*c values); ``flip``: of the filters turned by 180
    degrees, as the backward-data pass convolves. Returns the planes as a (16, k, c) view."""
    k, _, _, c = wt.shape
    planes = _planes(u, k, c)
    if _native(wt, u):
        ps = _plane_stride(k, c)
        ops.rows(k, lambda r: _lib.vmem_wg_filter(r.start, r.stop, _ptr(wt), _ptr(u), ps, k, c, int(flip)), 16 * k * c)
        return planes
    g = wt[:, ::-1, ::-1, :] if flip else wt
    t4 = t[: 12 * k * c].reshape(4, 3, k, c)
    for j in range(3):  # over the filter's rows: t[a, j] = sum_i G[a, i] g[:, i, j]
        _mix(G, [g[:, i, j, :] for i in range(3)], [t4[a, j] for a in range(4)])
    for a in range(4):  # over its columns: u[a, b] = sum_j G[b, j] t[a, j]
        _mix(G, [t4[a, j] for j in range(3)], [planes[4 * a + b] for b in range(4)])
    return planes


def filter_gradient(du: np.ndarray, t: np.ndarray, dw: np.ndarray, ops: HostOps = _IN_TURN) -> None:
    """``dw[:, i, j, :] = (G^T dU G)[i, j]``: the gradient of the filters (k, 3, 3, c) from that of their
    transforms (``du``: 16 planes of k x c as :func:`layout` lays them out; ``t``: 12*k*c values)."""
    k, _, _, c = dw.shape
    if _native(du, dw):
        ps = _plane_stride(k, c)
        ops.rows(k, lambda r: _lib.vmem_wg_filter_grad(r.start, r.stop, _ptr(du), _ptr(dw), ps, k, c), 16 * k * c)
        return
    planes = _planes(du, k, c)
    t4 = t[: 12 * k * c].reshape(3, 4, k, c)
    for b in range(4):  # t[i, b] = sum_a G[a, i] du[a, b]
        _mix(_GT, [planes[4 * a + b] for a in range(4)], [t4[i, b] for i in range(3)])
    for i in range(3):  # dw[i, j] = sum_b G[b, j] t[i, b]
        _mix(_GT, [t4[i, b] for b in range(4)], [dw[:, i, j, :] for j in range(3)])


# -- tile transforms: C on float32, NumPy otherwise ----------------------------------------------------
def _native(*arrays: np.ndarray | None) -> bool:
    """Whether the C kernels take these arrays (None: an absent bias): float32, contiguous, built."""
    return _lib is not None and all(a is None or (a.dtype == np.float32 and a.flags.c_contiguous) for a in arrays)


def _ptr(a: np.ndarray) -> Any:
    return _ffi.cast("float *", _ffi.from_buffer(a))


def _planes(buf: np.ndarray, tiles: int, channels: int) -> np.ndarray:
    """The 16 planes in ``buf`` as a (16, tiles, channels) view (planes :func:`_plane_stride` apart)."""
    s = buf.itemsize
    return as_strided(buf, (16, tiles, channels), (_plane_stride(tiles, channels) * s, channels * s, s))


def input_transform(
    x: np.ndarray, v: np.ndarray, th: int, tw: int, pad: tuple[int, int], part: tuple[int, int] | None = None
) -> np.ndarray:
    """The tiles of images ``x`` (nb, h, w, c), zero-padded by ``pad``, as 16 planes of ``v``
    (returned as the (16, nb*th*tw, c) view). ``part``: only the tiles in that range (image-major), on
    the C kernels only (see :func:`_native`); the NumPy reference does every tile."""
    nb, h, w, c = x.shape
    tiles = nb * th * tw
    planes = _planes(v, tiles, c)
    if _native(x, v):
        t0, t1 = part or (0, tiles)
        _lib.vmem_wg_input(t0, t1, _ptr(x), _ptr(v), _plane_stride(tiles, c), h, w, c, th, tw, *pad)
        return planes
    assert part is None, "tile ranges are for the C kernels"
    ph, pw = pad
    xpad = np.zeros((nb, 2 * th + 2, 2 * tw + 2, c), x.dtype)
    rows, cols = min(h, 2 * th + 2 - ph), min(w, 2 * tw + 2 - pw)
    xpad[:, ph : ph + rows, pw : pw + cols] = x[:, :rows, :cols]
    s = xpad.strides
    d = as_strided(xpad, (nb, th, tw, 4, 4, c), (s[0], 2 * s[1], 2 * s[2], s[1], s[2], s[3]), writeable=False)
    bt = np.array(BT, x.dtype)
    planes[...] = np.einsum("ai,ntuijc,bj->abntuc", bt, d, bt).reshape(16, tiles, c)
    return planes


def output_transform(
    m: np.ndarray, y: np.ndarray, th: int, tw: int, bias: np.ndarray | None, part: tuple[int, int] | None = None
) -> None:
    """``y`` (nb, ho, wo, k) from the 16 planes of ``m``: each tile's 2x2 outputs, plus ``bias``
    (``part``: as :func:`input_transform`'s)."""
    nb, ho, wo, k = y.shape
    tiles = nb * th * tw
    if _native(m, y, bias):
        t0, t1 = part or (0, tiles)
        _lib.vmem_wg_output(
            t0,
            t1,
            _ptr(m),
            _ffi.NULL if bias is None else _ptr(bias),
            _ptr(y),
            _plane_stride(tiles, k),
            ho,
            wo,
            k,
            th,
            tw,
        )
        return
    assert part is None, "tile ranges are for the C kernels"
    at = np.array(AT, y.dtype)
    mm = _planes(m, tiles, k).reshape(4, 4, nb, th, tw, k)
    full = np.einsum("ia,abntuk,jb->ntiujk", at, mm, at).reshape(nb, 2 * th, 2 * tw, k)
    y[...] = full[:, :ho, :wo]
    if bias is not None:
        y += bias


def output_adjoint(dy: np.ndarray, m: np.ndarray, th: int, tw: int, part: tuple[int, int] | None = None) -> np.ndarray:
    """The adjoint of :func:`output_transform` (without bias): dy (nb, ho, wo, k) to the 16 planes of
    ``m`` (returned as the (16, nb*th*tw, k) view; ``part``: as :func:`input_transform`'s)."""
    nb, ho, wo, k = dy.shape
    tiles = nb * th * tw
    planes = _planes(m, tiles, k)
    if _native(dy, m):
        t0, t1 = part or (0, tiles)
        _lib.vmem_wg_output_adjoint(t0, t1, _ptr(dy), _ptr(m), _plane_stride(tiles, k), ho, wo, k, th, tw)
        return planes
    assert part is None, "tile ranges are for the C kernels"
    g = np.zeros((nb, 2 * th, 2 * tw, k), dy.dtype)
    g[:, :ho, :wo] = dy
    at = np.array(AT, dy.dtype)
    planes[...] = np.einsum("ia,ntiujk,jb->abntuk", at, g.reshape(nb, th, 2, tw, 2, k), at).reshape(16, tiles, k)
    return planes


# -- the passes ---------------------------------------------------------------------------------------
def _chunks(n: int, nb: int) -> list[slice]:
    return [b for b, _ in _image_chunks(n, nb)]


def _convolve(
    src: np.ndarray,
    dst: np.ndarray,
    u: np.ndarray,
    transposed: bool,
    pad: tuple[int, int],
    nb: int,
    shared: dict[str, np.ndarray],
    lanes: list[dict[str, np.ndarray]],
    bias: np.ndarray | None,
    ops: HostOps,
) -> None:
    """dst = the convolution of src by the transformed filters ``u`` (16, k, c): ``M = V u^T`` where
    ``transposed`` (forward: u's rows are the outputs), else ``M = V u`` (backward-data)."""
    _, ho, wo, _ = dst.shape
    th, tw = _tiles(ho, wo)
    uu = u.transpose(0, 2, 1) if transposed else u
    if not lanes:
        _by_planes(src, None, dst, uu, pad, shared, bias, ops)
        return
    chunks = _chunks(src.shape[0], nb)

    def piece(i: int, j: int) -> None:
        slots, b = lanes[i], chunks[j]
        v = input_transform(src[b], slots["v"], th, tw, pad)
        tiles = v.shape[1]
        m = _planes(slots["m"], tiles, dst.shape[3])
        np.matmul(v, uu, out=m)
        output_transform(slots["m"], dst[b], th, tw, bias)

    ops.pull(piece, len(chunks), len(lanes))


#: Pieces the tile transforms of a whole-batch chunk are cut into (each a range of tiles).
_TILE_PIECES = 8


def _by_planes(
    x: np.ndarray,
    dy: np.ndarray | None,
    y: np.ndarray | None,
    uu: np.ndarray | None,
    pad: tuple[int, int],
    shared: dict[str, np.ndarray],
    bias: np.ndarray | None,
    ops: HostOps,
) -> None:
    """One chunk of the whole batch, in three rounds of pieces pulled by the lanes: the tiles' transforms
    by ranges of tiles, then the 16 GEMMs one plane at a time, then (forward, backward-data) the output
    transform by ranges of tiles. With ``dy`` (backward-filter): ``V`` from x and ``M`` from dy, then
    ``du[p] = M[p]^T V[p]`` over every tile. Else ``y`` = the convolution of x by ``uu``. Every piece
    writes its own rows or planes, so the results do not depend on the lanes. On the NumPy reference
    (float64) each transform is one piece."""
    n = x.shape[0]
    out = dy if dy is not None else y
    assert out is not None and (dy is not None or (y is not None and uu is not None))
    _, ho, wo, cout = out.shape
    th, tw = _tiles(ho, wo)
    tiles = n * th * tw
    v, m = _planes(shared["v"], tiles, x.shape[3]), _planes(shared["m"], tiles, cout)

    def parts(*arrays: np.ndarray | None) -> list[tuple[int, int] | None]:
        if not _native(*arrays):
            return [None]
        return [(r.start, r.stop) for r in _lanes.split(tiles, _TILE_PIECES)]

    ins = parts(x, shared["v"], dy, shared["m"])

    def transform(_: int, i: int) -> None:
        input_transform(x, shared["v"], th, tw, pad, ins[i])
        if dy is not None:
            output_adjoint(dy, shared["m"], th, tw, ins[i])

    ops.pull(transform, len(ins))
    if dy is not None:
        du = _planes(shared["du"], cout, x.shape[3])
        ops.pull(lambda _, p: np.matmul(m[p].T, v[p], out=du[p]), 16)
        return
    assert y is not None and uu is not None
    ops.pull(lambda _, p: np.matmul(v[p], uu[p], out=m[p]), 16)
    outs = parts(shared["m"], y, bias)
    ops.pull(lambda _, i: output_transform(shared["m"], y, th, tw, bias, outs[i]), len(outs))


def forward(
    x: np.ndarray,
    wt: np.ndarray,
    bias: np.ndarray | None,
    y: np.ndarray,
    pad: tuple[int, int],
    nb: int,
    shared: dict[str, np.ndarray],
    lanes: list[dict[str, np.ndarray]],
    ops: HostOps = _IN_TURN,
) -> None:
    """y = conv(x, wt) + bias, x (n, h, w, c), wt (k, 3, 3, c), y (n, ho, wo, k); ``ops`` runs the
    pieces (:mod:`vmem.nn.ops`)."""
    u = filter_transform(wt, shared["u"], shared["t"], ops=ops)
    _convolve(x, y, u, True, pad, nb, shared, lanes, bias, ops)


def backward_data(
    dy: np.ndarray,
    wt: np.ndarray,
    dx: np.ndarray,
    pad: tuple[int, int],
    nb: int,
    shared: dict[str, np.ndarray],
    lanes: list[dict[str, np.ndarray]],
    ops: HostOps = _IN_TURN,
) -> None:
    """dx from dy: the forward convolution of dy padded by 2 - p with the flipped filters."""
    u = filter_transform(wt, shared["u"], shared["t"], flip=True, ops=ops)
    _convolve(dy, dx, u, False, (2 - pad[0], 2 - pad[1]), nb, shared, lanes, None, ops)


def backward_filter(
    x: np.ndarray,
    dy: np.ndarray,
    dw: np.ndarray,
    pad: tuple[int, int],
    nb: int,
    shared: dict[str, np.ndarray],
    lanes: list[dict[str, np.ndarray]],
    ops: HostOps = _IN_TURN,
) -> None:
    """dw (k, 3, 3, c) from x and dy: each lane sums ``M^T V`` over its chunks' tiles into its own
    ``du``; the lanes' sums are added in lane order, then transformed back. On small maps (no lane
    slots), ``du`` is computed plane by plane over every tile of the batch (:func:`_by_planes`)."""
    n, ho, wo, k = dy.shape
    c = x.shape[3]
    th, tw = _tiles(ho, wo)
    if not lanes:
        _by_planes(x, dy, None, None, pad, shared, None, ops)
        filter_gradient(shared["du"], shared["t"], dw, ops)
        return
    chunks = _chunks(n, nb)

    def lane(i: int) -> None:
        slots = lanes[i]
        du = _planes(slots["du"], k, c)
        for j, b in enumerate(chunks[i :: len(lanes)]):
            v = input_transform(x[b], slots["v"], th, tw, pad)
            m = output_adjoint(dy[b], slots["m"], th, tw)
            if j == 0:
                np.matmul(m.transpose(0, 2, 1), v, out=du)
            else:
                tmp = _planes(slots["tmp"], k, c)
                np.matmul(m.transpose(0, 2, 1), v, out=tmp)
                du += tmp

    ops.run(lane, len(lanes))
    total = _planes(lanes[0]["du"], k, c)
    for slots in lanes[1:]:
        total += _planes(slots["du"], k, c)
    filter_gradient(lanes[0]["du"], shared["t"], dw, ops)
