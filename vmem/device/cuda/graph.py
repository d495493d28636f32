"""cuDNN's graph (backend) API for one convolution pass: the engines cuDNN has for it, built and run.

The legacy API (:mod:`.cudnn`) offers a fixed list of algorithms per pass, and for FP32 tensors stored
channels last only implicit GEMM (forward) and algo_0/algo_1 (backward). The graph API describes the
pass as an operation graph of tensors with explicit strides and lets cuDNN propose engines for it
(its heuristics, ranked) or enumerate every engine it has; each engine configuration that finalizes
into an execution plan runs the pass. This is what frameworks built on cuDNN's frontend use, and what
may replace the legacy calls in :class:`.conv.CudnnConv` (its interface is kept small for that).

A pass's tensors are stored in FP32, fp16 or bf16 (the compute type FLOAT for all three, as the legacy
API's pseudo-half); a forward may be fused with the bias and the ReLU after it (``fuse``): the
convolution's result stays in FP32 in a virtual tensor, the bias (FP32, its own tensor ``b``) is added
and the ReLU applied by pointwise operations, and the output is rounded once into its storage type.

Without a GPU the tensor, convolution and operation descriptors can be built and checked (finalized);
the operation graph, the engines and the plans need a handle, hence a GPU. Which engines a pass may use
follows its data and the device's FP32 math (:func:`admits`): exact FP32 leaves out the engines whose
numerical notes say they use tensor cores or convert FP32 inputs down (TF32). Enum values are cuDNN 9's
(``cudnn_graph.h``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from . import cudnn

if TYPE_CHECKING:
    from ..._typing import CData

__all__ = ["Descriptor", "ConvPass", "EngineConfig", "ExecutionPlan", "UIDS", "FUSIONS", "admits"]

# cudnnBackendDescriptorType_t
_POINTWISE, _OP_POINTWISE = 0, 13
_ENGINE, _ENGINECFG, _ENGINEHEUR, _EXECUTION_PLAN = 2, 3, 4, 5
_CONVOLUTION = 1
_OP = {"forward": 10, "backward_filter": 11, "backward_data": 12}
_OPERATIONGRAPH, _VARIANT_PACK, _TENSOR = 15, 16, 17
# cudnnBackendAttributeType_t
T_HANDLE, T_DATA_TYPE, T_BOOLEAN, T_INT64, T_FLOAT, T_DOUBLE, T_VOID_PTR, T_CONVOLUTION_MODE, T_HEUR_MODE = range(9)
T_NUMERICAL_NOTE, T_POINTWISE_MODE, T_BACKEND_DESCRIPTOR, T_BEHAVIOR_NOTE = 11, 14, 15, 19
# cudnnBackendAttributeName_t: a pointwise descriptor, and the operation applying one
A_PW_MODE, A_PW_MATH_PREC = 0, 1
A_PWOP_DESC, A_PWOP_X, A_PWOP_B, A_PWOP_Y, A_PWOP_ALPHA1, A_PWOP_ALPHA2 = 750, 751, 752, 753, 754, 755
#: cudnnPointwiseMode_t
PW_ADD, PW_RELU_FWD = 0, 100
# cudnnBackendAttributeName_t
A_CONV_COMP_TYPE, A_CONV_MODE, A_CONV_DILATIONS, A_CONV_FILTER_STRIDES = 100, 101, 102, 103
A_CONV_POST_PADDINGS, A_CONV_PRE_PADDINGS, A_CONV_SPATIAL_DIMS = 104, 105, 106
A_HEUR_MODE, A_HEUR_GRAPH, A_HEUR_RESULTS = 200, 201, 202
A_CFG_ENGINE, A_CFG_WORKSPACE = 300, 303
A_PLAN_HANDLE, A_PLAN_CONFIG, A_PLAN_WORKSPACE = 400, 401, 402
A_GRAPH_HANDLE, A_GRAPH_OPS, A_GRAPH_ENGINE_COUNT = 800, 801, 802
A_TENSOR_ALIGNMENT, A_TENSOR_DATA_TYPE, A_TENSOR_DIMS, A_TENSOR_STRIDES, A_TENSOR_UID = 900, 901, 902, 903, 906
A_TENSOR_IS_VIRTUAL = 907
A_PACK_UIDS, A_PACK_POINTERS, A_PACK_WORKSPACE = 1000, 1001, 1003
A_ENGINE_GRAPH, A_ENGINE_INDEX, A_ENGINE_NUMERICAL_NOTE, A_ENGINE_BEHAVIOR_NOTE = 1300, 1301, 1303, 1305
#: Each operation's attributes, in the order alpha, beta, conv desc, then its three tensors by role.
_OP_ATTRS = {
    "forward": {"alpha": 700, "beta": 701, "conv": 702, "w": 703, "x": 704, "y": 705},
    "backward_data": {"alpha": 706, "beta": 707, "conv": 708, "w": 709, "x": 710, "y": 711},  # x: dx, y: dy
    "backward_filter": {"alpha": 712, "beta": 713, "conv": 714, "w": 715, "x": 716, "y": 717},  # w: dw, y: dy
}
#: cudnnBackendHeurMode_t
HEUR_INSTANT, HEUR_B, HEUR_FALLBACK, HEUR_A = 0, 1, 2, 3
#: cudnnBackendNumericalNote_t, by name
NUMERICAL_NOTES = (
    "tensor_core",
    "down_convert_inputs",
    "reduced_precision_reduction",
    "fft",
    "nondeterministic",
    "winograd",
    "winograd_4x4",
    "winograd_6x6",
    "winograd_13x13",
    "strict_nan_prop",
)
#: cudnnBackendBehaviorNote_t, by name
BEHAVIOR_NOTES = (
    "runtime_compilation",
    "filter_int8x32_reorder",
    "bias_int8x32_reorder",
    "cuda_graph_native",
    "cublaslt_dependency",
)
#: Notes that mean an engine does not compute in exact FP32 (TF32 tensor cores, or inputs converted down).
INEXACT = frozenset({"tensor_core", "down_convert_inputs", "reduced_precision_reduction"})
#: The tensors' unique ids in every graph and variant pack (``b``: a fused forward's bias).
UIDS = {"x": 1, "w": 2, "y": 3, "b": 4}
#: What a forward may be fused with, in graph order: the bias added, then the ReLU.
FUSIONS = ("bias", "relu")
#: The ids of a fused forward's intermediate (virtual) tensors: the convolution's result, then the biased one.
_VIRTUAL_UIDS = (101, 102)
_CROSS_CORRELATION = 1
_C_TYPES = {
    T_HANDLE: "cudnnHandle_t",
    T_DATA_TYPE: "int",
    T_BOOLEAN: "_Bool",
    T_INT64: "int64_t",
    T_FLOAT: "float",
    T_DOUBLE: "double",
    T_VOID_PTR: "void *",
    T_CONVOLUTION_MODE: "int",
    T_HEUR_MODE: "int",
    T_NUMERICAL_NOTE: "int",
    T_POINTWISE_MODE: "int",
    T_BACKEND_DESCRIPTOR: "cudnnBackendDescriptor_t",
    T_BEHAVIOR_NOTE: "int",
}


class Descriptor:
    """One backend descriptor (destroyed with the object). ``set`` takes a list of values of the attribute's
    type: ints, floats, handles, device pointers (ints) or other :class:`Descriptor` objects, which it keeps
    alive as long as this one."""

    def __init__(self, kind: int):
        f = cudnn.ffi()
        out = f.new("cudnnBackendDescriptor_t *")
        cudnn.check("cudnnBackendCreateDescriptor", cudnn.lib().cudnnBackendCreateDescriptor(kind, out))
        self.ptr = f.gc(out[0], cudnn.lib().cudnnBackendDestroyDescriptor)
        self.kind = kind
        self._refs: list[Any] = []

    def set(self, name: int, type_: int, values: Sequence[Any]) -> "Descriptor":
        f = cudnn.ffi()
        if type_ == T_BACKEND_DESCRIPTOR:
            self._refs.extend(values)
            items: list[Any] = [v.ptr for v in values]
        elif type_ == T_VOID_PTR:
            items = [f.cast("void *", v) for v in values]
        else:
            items = list(values)
        array = f.new(f"{_C_TYPES[type_]}[]", items)
        cudnn.check(
            f"cudnnBackendSetAttribute({name})",
            cudnn.lib().cudnnBackendSetAttribute(self.ptr, name, type_, len(items), array),
        )
        return self

    def count(self, name: int, type_: int) -> int:
        """How many elements attribute ``name`` holds."""
        got = cudnn.ffi().new("int64_t *")
        cudnn.check(
            f"cudnnBackendGetAttribute({name})",
            cudnn.lib().cudnnBackendGetAttribute(self.ptr, name, type_, 0, got, cudnn.ffi().NULL),
        )
        return int(got[0])

    def get(self, name: int, type_: int, most: int = 1) -> list[Any]:
        """Up to ``most`` values of attribute ``name`` (ints or floats; not descriptors: see ``get_into``)."""
        f = cudnn.ffi()
        array, got = f.new(f"{_C_TYPES[type_]}[]", max(most, 1)), f.new("int64_t *")
        cudnn.check(
            f"cudnnBackendGetAttribute({name})",
            cudnn.lib().cudnnBackendGetAttribute(self.ptr, name, type_, most, got, array),
        )
        return [array[i] for i in range(int(got[0]))]

    def get_into(self, name: int, targets: Sequence["Descriptor"]) -> int:
        """Fill the descriptors ``targets`` (made, not finalized) from attribute ``name``; how many were."""
        f = cudnn.ffi()
        array, got = f.new("cudnnBackendDescriptor_t[]", [t.ptr for t in targets]), f.new("int64_t *")
        cudnn.check(
            f"cudnnBackendGetAttribute({name})",
            cudnn.lib().cudnnBackendGetAttribute(self.ptr, name, T_BACKEND_DESCRIPTOR, len(targets), got, array),
        )
        return int(got[0])

    def finalize(self) -> "Descriptor":
        cudnn.check(f"cudnnBackendFinalize(type {self.kind})", cudnn.lib().cudnnBackendFinalize(self.ptr))
        return self


def _tensor(
    uid: int,
    dims: Iterable[int],
    strides: Iterable[int],
    alignment: int,
    data: int = cudnn.FLOAT,
    virtual: bool = False,
) -> Descriptor:
    d = (
        Descriptor(_TENSOR)
        .set(A_TENSOR_UID, T_INT64, [uid])
        .set(A_TENSOR_DATA_TYPE, T_DATA_TYPE, [data])
        .set(A_TENSOR_DIMS, T_INT64, list(dims))
        .set(A_TENSOR_STRIDES, T_INT64, list(strides))
        .set(A_TENSOR_ALIGNMENT, T_INT64, [alignment])
    )
    if virtual:  # an intermediate of the graph: in no variant pack, never in memory
        d.set(A_TENSOR_IS_VIRTUAL, T_BOOLEAN, [True])
    return d.finalize()


def _pointwise(mode: int, x: Descriptor, y: Descriptor, b: Descriptor | None = None) -> Descriptor:
    """The operation ``y = mode(x[, b])`` computed in FP32."""
    pw = Descriptor(_POINTWISE).set(A_PW_MODE, T_POINTWISE_MODE, [mode]).set(A_PW_MATH_PREC, T_DATA_TYPE, [cudnn.FLOAT])
    op = Descriptor(_OP_POINTWISE).set(A_PWOP_DESC, T_BACKEND_DESCRIPTOR, [pw.finalize()])
    op.set(A_PWOP_X, T_BACKEND_DESCRIPTOR, [x]).set(A_PWOP_Y, T_BACKEND_DESCRIPTOR, [y])
    op.set(A_PWOP_ALPHA1, T_FLOAT, [1.0])
    if b is not None:
        op.set(A_PWOP_B, T_BACKEND_DESCRIPTOR, [b]).set(A_PWOP_ALPHA2, T_FLOAT, [1.0])
    return op.finalize()


def _strides(n: int, c: int, h: int, w: int, layout: int) -> list[int]:
    """Strides of a logical (N, C, H, W) tensor stored NHWC or NCHW (filters: K, C, kh, kw as KRSC or KCRS)."""
    if layout == cudnn.NHWC:
        return [h * w * c, 1, w * c, c]
    return [c * h * w, h * w, w, 1]


@dataclass
class EngineConfig:
    """One configuration cuDNN offers for a pass: its engine's global index, notes and descriptor."""

    desc: Descriptor
    index: int
    numerical: frozenset
    behavior: frozenset

    @property
    def exact(self) -> bool:
        """Computes in exact FP32 (no tensor cores, no inputs converted down)."""
        return not (self.numerical & INEXACT)

    @property
    def deterministic(self) -> bool:
        return "nondeterministic" not in self.numerical

    @property
    def name(self) -> str:
        notes = sorted(self.numerical | self.behavior)
        return f"engine {self.index}" + (f" ({', '.join(notes)})" if notes else "")


def admits(config: EngineConfig, dtype: str = "float32", math: str = "exact") -> bool:
    """Whether a pass on ``dtype`` data may run ``config`` on a device whose FP32 math is ``math``: exact FP32
    (and FP64) only engines without tensor cores or down-converted inputs; TF32 and half precision any but
    those that reduce in less than FP32 (the legacy API's pseudo-half accumulates in FP32 too)."""
    if dtype in ("float32", "float64") and math == "exact":
        return config.exact
    return "reduced_precision_reduction" not in config.numerical


class ConvPass:
    """One pass of a convolution as an operation graph: ``geometry`` as :func:`.conv._geometry` gives it,
    tensors stored ``layout`` (vmem's: NHWC, filters KRSC) in ``dtype`` (compute type FLOAT; FP64 for
    float64). The tensors of the pass are bound by role: ``x`` the image (dx for backward-data), ``w`` the
    filters (dw for backward-filter), ``y`` the response (dy for both backward passes), with the ids of
    :data:`UIDS`. A forward may be fused (``fuse``, a subset of :data:`FUSIONS`) with the bias, an FP32
    tensor ``b`` of one value per output channel, and the ReLU: the convolution's result and the biased one
    are FP32 virtual tensors, rounded once into ``y``."""

    def __init__(
        self,
        pass_: str,
        geometry: tuple,
        layout: int = cudnn.NHWC,
        alignment: int = 16,
        dtype: str = "float32",
        fuse: Iterable[str] = (),
    ):
        if pass_ not in _OP:
            raise ValueError(f"unknown convolution pass {pass_!r}; use one of {', '.join(_OP)}")
        fuse = frozenset(fuse)
        if fuse - set(FUSIONS) or (fuse and pass_ != "forward"):
            raise ValueError(f"a {pass_} pass fuses none of {sorted(fuse)}: a forward fuses {', '.join(FUSIONS)}")
        if dtype not in cudnn.DATA_TYPES:
            raise ValueError(f"cuDNN's graph API on {dtype}: vmem hands cuDNN {', '.join(cudnn.DATA_TYPES)}")
        n, c, h, w, k, (kh, kw), stride, padding, *rest = geometry
        if rest and (rest[0] != 1 or tuple(rest[1]) != (1, 1)):
            from ...errors import DeviceError

            raise DeviceError(
                f"a grouped or dilated convolution (groups={rest[0]}, dilation={tuple(rest[1])}) runs through "
                "cuDNN's legacy API (conv_api='legacy', the default), not its graph API"
            )
        ho = (h + 2 * padding[0] - kh) // stride[0] + 1
        wo = (w + 2 * padding[1] - kw) // stride[1] + 1
        data = cudnn.DATA_TYPES[dtype]
        compute = cudnn.DOUBLE if data == cudnn.DOUBLE else cudnn.FLOAT
        self.pass_, self.dtype, self.fuse = pass_, dtype, fuse
        y_dims, y_strides = (n, k, ho, wo), _strides(n, k, ho, wo, layout)
        self.tensors = {
            "x": _tensor(UIDS["x"], (n, c, h, w), _strides(n, c, h, w, layout), alignment, data),
            "w": _tensor(UIDS["w"], (k, c, kh, kw), _strides(k, c, kh, kw, layout), alignment, data),
            "y": _tensor(UIDS["y"], y_dims, y_strides, alignment, data),
        }
        if "bias" in fuse:
            self.tensors["b"] = _tensor(UIDS["b"], (1, k, 1, 1), _strides(1, k, 1, 1, layout), alignment, cudnn.FLOAT)
        #: the roles a run binds, in the variant pack's order
        self.roles = tuple(self.tensors)
        self.conv = (
            Descriptor(_CONVOLUTION)
            .set(A_CONV_COMP_TYPE, T_DATA_TYPE, [compute])
            .set(A_CONV_MODE, T_CONVOLUTION_MODE, [_CROSS_CORRELATION])
            .set(A_CONV_SPATIAL_DIMS, T_INT64, [2])
            .set(A_CONV_DILATIONS, T_INT64, [1, 1])
            .set(A_CONV_FILTER_STRIDES, T_INT64, list(stride))
            .set(A_CONV_PRE_PADDINGS, T_INT64, list(padding))
            .set(A_CONV_POST_PADDINGS, T_INT64, list(padding))
            .finalize()
        )
        # a fused forward: conv -> (virtual) -> + b -> (virtual) -> ReLU -> y, each intermediate in FP32
        stages = [f for f in FUSIONS if f in fuse]
        outs = [
            _tensor(u, y_dims, y_strides, alignment, cudnn.FLOAT, virtual=True) for u in _VIRTUAL_UIDS[: len(stages)]
        ]
        outs.append(self.tensors["y"])
        attrs = _OP_ATTRS[pass_]
        op = Descriptor(_OP[pass_]).set(attrs["alpha"], T_FLOAT, [1.0]).set(attrs["beta"], T_FLOAT, [0.0])
        op.set(attrs["conv"], T_BACKEND_DESCRIPTOR, [self.conv])
        for role in ("x", "w"):
            op.set(attrs[role], T_BACKEND_DESCRIPTOR, [self.tensors[role]])
        op.set(attrs["y"], T_BACKEND_DESCRIPTOR, [outs[0]])
        self.ops = [op.finalize()]
        for stage, x_, y_ in zip(stages, outs, outs[1:]):
            if stage == "bias":
                self.ops.append(_pointwise(PW_ADD, x_, y_, self.tensors["b"]))
            else:
                self.ops.append(_pointwise(PW_RELU_FWD, x_, y_))
        self.op = self.ops[0]
        self._graph: Descriptor | None = None

    def graph(self, handle: CData) -> Descriptor:
        """The operation graph on ``handle`` (a cuDNN handle: needs a GPU), made once."""
        if self._graph is None:
            self._graph = (
                Descriptor(_OPERATIONGRAPH)
                .set(A_GRAPH_HANDLE, T_HANDLE, [handle])
                .set(A_GRAPH_OPS, T_BACKEND_DESCRIPTOR, self.ops)
                .finalize()
            )
        return self._graph

    def heuristics(
        self, handle: CData, mode: int = HEUR_A, exact: bool = True, admit: Callable[[EngineConfig], bool] | None = None
    ) -> list[EngineConfig]:
        """cuDNN's ranked configurations for this pass (best first): those ``admit`` takes, or with ``exact``
        only exact FP32 ones."""
        heur = (
            Descriptor(_ENGINEHEUR)
            .set(A_HEUR_GRAPH, T_BACKEND_DESCRIPTOR, [self.graph(handle)])
            .set(A_HEUR_MODE, T_HEUR_MODE, [mode])
            .finalize()
        )
        cfgs = [Descriptor(_ENGINECFG) for _ in range(heur.count(A_HEUR_RESULTS, T_BACKEND_DESCRIPTOR))]
        got = heur.get_into(A_HEUR_RESULTS, cfgs) if cfgs else 0
        out = [_describe(cfg) for cfg in cfgs[:got]]
        return [c for c in out if (admit(c) if admit is not None else c.exact or not exact)]

    def engines(
        self, handle: CData, exact: bool = True, admit: Callable[[EngineConfig], bool] | None = None
    ) -> list[EngineConfig]:
        """Every engine cuDNN has for this pass, each with its default knobs (those that do not support the
        pass are left out); filtered as :meth:`heuristics` filters."""
        graph = self.graph(handle)
        out = []
        for index in range(graph.get(A_GRAPH_ENGINE_COUNT, T_INT64)[0]):
            try:
                engine = (
                    Descriptor(_ENGINE)
                    .set(A_ENGINE_GRAPH, T_BACKEND_DESCRIPTOR, [graph])
                    .set(A_ENGINE_INDEX, T_INT64, [index])
                    .finalize()
                )
                cfg = Descriptor(_ENGINECFG).set(A_CFG_ENGINE, T_BACKEND_DESCRIPTOR, [engine]).finalize()
            except cudnn.CudnnError:
                continue
            config = _describe(cfg)
            if admit(config) if admit is not None else config.exact or not exact:
                out.append(config)
        return out


def _describe(cfg: Descriptor) -> EngineConfig:
    engine = Descriptor(_ENGINE)
    cfg.get_into(A_CFG_ENGINE, [engine])
    cfg._refs.append(engine)
    numerical = engine.get(A_ENGINE_NUMERICAL_NOTE, T_NUMERICAL_NOTE, len(NUMERICAL_NOTES))
    behavior = engine.get(A_ENGINE_BEHAVIOR_NOTE, T_BEHAVIOR_NOTE, len(BEHAVIOR_NOTES))
    return EngineConfig(
        cfg,
        int(engine.get(A_ENGINE_INDEX, T_INT64)[0]),
        frozenset(NUMERICAL_NOTES[i] for i in numerical if 0 <= i < len(NUMERICAL_NOTES)),
        frozenset(BEHAVIOR_NOTES[i] for i in behavior if 0 <= i < len(BEHAVIOR_NOTES)),
    )


class ExecutionPlan:
    """An engine configuration built into an execution plan on ``handle``; ``workspace`` is the bytes it
    needs. ``owner`` (the :class:`ConvPass`) is kept: cuDNN's plan refers to its operation graph, which
    must not be destroyed while the plan runs. Raises :class:`.cudnn.CudnnError` if the configuration cannot run this pass."""

    def __init__(self, handle: CData, config: EngineConfig, owner: Any = None):
        self.config = config
        self.handle = handle
        self.owner = owner  # the pass whose operation graph the plan was built from: it lives as long
        self.desc = (
            Descriptor(_EXECUTION_PLAN)
            .set(A_PLAN_HANDLE, T_HANDLE, [handle])
            .set(A_PLAN_CONFIG, T_BACKEND_DESCRIPTOR, [config.desc])
            .finalize()
        )
        self.workspace = int(self.desc.get(A_PLAN_WORKSPACE, T_INT64)[0])

    @property
    def roles(self) -> tuple[str, ...]:
        """The tensors a run binds: x, w, y, and b where the pass adds a bias."""
        return tuple(getattr(self.owner, "roles", ("x", "w", "y")))

    def execute(self, x: int, w: int, y: int, workspace: int = 0, handle: CData = None, b: int | None = None) -> None:
        """Run the pass on the device pointers ``x``, ``w``, ``y`` (by role, as in :class:`ConvPass`; ``b``
        the bias of a fused forward) with ``workspace`` (a device pointer to at least ``self.workspace``
        bytes), on the stream of ``handle`` (by default the one the plan was built with)."""
        given = {"x": x, "w": w, "y": y, "b": b}
        missing = [r for r in self.roles if given[r] is None]
        if missing:
            raise ValueError(f"{self.config.name}: the pass binds {', '.join(self.roles)}; {missing} not given")
        pack = (
            Descriptor(_VARIANT_PACK)
            .set(A_PACK_UIDS, T_INT64, [UIDS[r] for r in self.roles])
            .set(A_PACK_POINTERS, T_VOID_PTR, [given[r] for r in self.roles])
            .set(A_PACK_WORKSPACE, T_VOID_PTR, [workspace])
            .finalize()
        )
        cudnn.check(
            f"cudnnBackendExecute({self.config.name})",
            cudnn.lib().cudnnBackendExecute(self.handle if handle is None else handle, self.desc.ptr, pack.ptr),
        )

    def seconds(self, x: int, w: int, y: int, workspace: int = 0, b: int | None = None) -> float:
        """One run of the pass timed by CUDA events on the current stream (after an untimed warm-up run);
        the plan's handle must be bound to that stream."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        self.execute(x, w, y, workspace, b=b)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        self.execute(x, w, y, workspace, b=b)
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3
