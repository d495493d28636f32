"""cuDNN's graph (backend) API on the stand-in: descriptors made, set, read and finalized as cuDNN keeps them,
engines proposed and run on the stand-in's device memory with the CPU device's convolutions.

The engines it has (global indices; 12 in all, as ``ENGINE_GLOBAL_COUNT`` says):
- a graph of one convolution: e0 (the host's implicit algorithm, exact), e1 (im2col on tensor cores: FP32
  inputs rounded to TF32, as the legacy API's tensor-op math), e2 (Winograd, where the host's applies), e3
  (implicit, non-deterministic); cuDNN's heuristics rank e1, e0, e2;
- a convolution fused with pointwise operations (a bias added, a ReLU): e10 (tensor cores) and e11 (exact),
  both compiled at run time; the convolution's result stays in FP32 through the pointwise operations and is
  rounded once into the output;
- e4 to e9: none of these graphs (an engine descriptor for them does not finalize: NOT_SUPPORTED).

What cuDNN refuses is refused: an attribute of another descriptor's kind or of another type (BAD_PARAM), a
descriptor finalized without what it needs or set after it was finalized, an operation whose tensors'
dimensions disagree with the convolution, an operation graph whose operations are not one chain from the
convolution, a variant pack that leaves a non-virtual tensor of the graph unbound or binds a virtual one, a
workspace smaller than the plan's, a handle used on a stream other than the one running, a plan built from an
engine whose operation graph was destroyed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import vmem
from vmem.device.hostconv import HostConv
from vmem.device.hostconv.catalog import algorithms as host_algorithms
from vmem.device.hostconv.catalog import workspace_bytes
from vmem.device.lanes import LaneOps
from vmem.nn.base import Ctx

SUCCESS, BAD_PARAM, NOT_SUPPORTED = 0, 2000, 3000
FLOAT, DOUBLE, HALF, BFLOAT16 = 0, 1, 2, 9
# descriptor kinds
POINTWISE, CONVOLUTION, ENGINE, ENGINECFG, ENGINEHEUR, PLAN = 0, 1, 2, 3, 4, 5
OP_FWD, OP_BWD_FILTER, OP_BWD_DATA, OP_POINTWISE, GRAPH, PACK, TENSOR = 10, 11, 12, 13, 15, 16, 17
CONV_OPS = {OP_FWD: "forward", OP_BWD_FILTER: "backward_filter", OP_BWD_DATA: "backward_data"}
# attribute types, and the C type of each element
T_HANDLE, T_DATA_TYPE, T_BOOLEAN, T_INT64, T_FLOAT, T_DOUBLE, T_VOID_PTR, T_CONV_MODE, T_HEUR_MODE = range(9)
T_NUMERICAL_NOTE, T_POINTWISE_MODE, T_DESCRIPTOR, T_BEHAVIOR_NOTE = 11, 14, 15, 19
C_TYPES = {
    T_HANDLE: "cudnnHandle_t",
    T_DATA_TYPE: "int",
    T_BOOLEAN: "_Bool",
    T_INT64: "int64_t",
    T_FLOAT: "float",
    T_DOUBLE: "double",
    T_VOID_PTR: "void *",
    T_CONV_MODE: "int",
    T_HEUR_MODE: "int",
    T_NUMERICAL_NOTE: "int",
    T_POINTWISE_MODE: "int",
    T_DESCRIPTOR: "cudnnBackendDescriptor_t",
    T_BEHAVIOR_NOTE: "int",
}
#: attribute -> (the descriptor kind it belongs to, its type, whether finalizing needs it)
ATTRS: dict[int, tuple[int, int, bool]] = {
    0: (POINTWISE, T_POINTWISE_MODE, True),
    1: (POINTWISE, T_DATA_TYPE, True),
    **{a: (CONVOLUTION, t, True) for a, t in zip(range(100, 107), (T_DATA_TYPE, T_CONV_MODE) + (T_INT64,) * 5)},
    200: (ENGINEHEUR, T_HEUR_MODE, True),
    201: (ENGINEHEUR, T_DESCRIPTOR, True),
    202: (ENGINEHEUR, T_DESCRIPTOR, False),
    300: (ENGINECFG, T_DESCRIPTOR, True),
    400: (PLAN, T_HANDLE, True),
    401: (PLAN, T_DESCRIPTOR, True),
    402: (PLAN, T_INT64, False),
    750: (OP_POINTWISE, T_DESCRIPTOR, True),
    751: (OP_POINTWISE, T_DESCRIPTOR, True),
    752: (OP_POINTWISE, T_DESCRIPTOR, False),
    753: (OP_POINTWISE, T_DESCRIPTOR, True),
    754: (OP_POINTWISE, T_FLOAT, False),
    755: (OP_POINTWISE, T_FLOAT, False),
    800: (GRAPH, T_HANDLE, True),
    801: (GRAPH, T_DESCRIPTOR, True),
    802: (GRAPH, T_INT64, False),
    900: (TENSOR, T_INT64, True),
    901: (TENSOR, T_DATA_TYPE, True),
    902: (TENSOR, T_INT64, True),
    903: (TENSOR, T_INT64, True),
    906: (TENSOR, T_INT64, True),
    907: (TENSOR, T_BOOLEAN, False),
    1000: (PACK, T_INT64, True),
    1001: (PACK, T_VOID_PTR, True),
    1003: (PACK, T_VOID_PTR, False),
    1300: (ENGINE, T_DESCRIPTOR, True),
    1301: (ENGINE, T_INT64, True),
    1303: (ENGINE, T_NUMERICAL_NOTE, False),
    1305: (ENGINE, T_BEHAVIOR_NOTE, False),
}
# each convolution operation's attributes: alpha, beta, conv, then its tensors w, x, y by role
for _op, _first in ((OP_FWD, 700), (OP_BWD_DATA, 706), (OP_BWD_FILTER, 712)):
    ATTRS.update({_first: (_op, T_FLOAT, True), _first + 1: (_op, T_FLOAT, True)})
    ATTRS.update({_first + i: (_op, T_DESCRIPTOR, True) for i in range(2, 6)})
CONV_ROLES = {"conv": 2, "w": 3, "x": 4, "y": 5}
FIRST = {OP_FWD: 700, OP_BWD_DATA: 706, OP_BWD_FILTER: 712}
PW_ADD, PW_RELU_FWD = 0, 100
NOTES = {"tensor_core": 0, "nondeterministic": 4, "winograd": 5}
RUNTIME_COMPILATION = 0
ENGINE_COUNT = 12
#: engine -> (host algorithm, numerical notes, behavior notes) for a graph of one convolution
PLAIN = {0: ("implicit", (), ()), 1: ("im2col", ("tensor_core",), ()), 2: ("winograd", ("winograd",), ())}
PLAIN[3] = ("implicit", ("nondeterministic",), ())
#: ... and for a convolution fused with pointwise operations
FUSED = {10: ("implicit", ("tensor_core",), (RUNTIME_COMPILATION,)), 11: ("implicit", (), (RUNTIME_COMPILATION,))}
RANKING = {"plain": (1, 0, 2), "fused": (10, 11)}


class GraphAPI:
    """The backend functions of vmem/csrc/cudnn.h, mixed into the stand-in's :class:`~.cudnn.Lib` (which
    keeps the objects, the handles and the streams)."""

    # -- descriptors ---------------------------------------------------------------------------------
    def cudnnBackendCreateDescriptor(self, kind: int, out: Any) -> int:
        kinds = (POINTWISE, CONVOLUTION, ENGINE, ENGINECFG, ENGINEHEUR, PLAN, OP_POINTWISE, GRAPH, PACK, TENSOR)
        if kind not in kinds and kind not in CONV_OPS:
            return NOT_SUPPORTED
        return self._new(out, "cudnnBackendDescriptor_t", kind="backend", type=kind, attrs={}, final=False)

    def cudnnBackendDestroyDescriptor(self, d: Any) -> int:
        return self._drop(d)

    def _desc(self, ptr: Any) -> dict | None:
        key = int(self.ffi.cast("intptr_t", ptr))
        d = self.objects.get(key)
        return d if d is not None and d.get("kind") == "backend" else None

    def _key(self, ptr: Any) -> int:
        return int(self.ffi.cast("intptr_t", ptr))

    def cudnnBackendSetAttribute(self, d: Any, name: int, type_: int, count: int, array: Any) -> int:
        desc = self._desc(d)
        spec = ATTRS.get(name)
        if desc is None or spec is None or spec[0] != desc["type"] or spec[1] != type_ or desc["final"] or count < 1:
            return BAD_PARAM
        items = self.ffi.cast(f"{C_TYPES[type_]} *", array)
        if type_ in (T_DESCRIPTOR, T_HANDLE, T_VOID_PTR):
            values = [self._key(items[i]) for i in range(count)]
            if type_ == T_DESCRIPTOR and any(self.objects.get(v, {}).get("final") is not True for v in values):
                return BAD_PARAM  # a descriptor attribute takes finalized descriptors
        else:
            values = [items[i] for i in range(count)]
        desc["attrs"][name] = values
        return SUCCESS

    def cudnnBackendGetAttribute(self, d: Any, name: int, type_: int, requested: int, count: Any, array: Any) -> int:
        desc = self._desc(d)
        spec = ATTRS.get(name)
        if desc is None or spec is None or spec[0] != desc["type"] or spec[1] != type_:
            return BAD_PARAM
        if type_ == T_DESCRIPTOR and name in (202, 300):  # fill the descriptors the caller made
            values = desc["results"] if name == 202 else [desc["attrs"][300][0]]
            count[0] = len(values)
            if requested:
                targets = self.ffi.cast("cudnnBackendDescriptor_t *", array)
                want = ENGINECFG if name == 202 else ENGINE
                for i, value in enumerate(values[:requested]):
                    target = self._desc(targets[i])
                    if target is None or target["type"] != want:
                        return BAD_PARAM
                    source = self.objects[value]
                    target.update(attrs=dict(source["attrs"]), final=True, engine=source.get("engine"))
            return SUCCESS
        if not desc["final"]:
            return BAD_PARAM
        values = self._read(desc, name)
        count[0] = len(values)
        if requested:
            out = self.ffi.cast(f"{C_TYPES[type_]} *", array)
            for i, v in enumerate(values[:requested]):
                out[i] = v
        return SUCCESS

    def _read(self, desc: dict, name: int) -> list:
        if name == 802:
            return [ENGINE_COUNT]
        if name == 402:
            return [desc["workspace"]]
        if name in (1303, 1305):
            _, numerical, behavior = desc["engine"]
            return [NOTES[n] for n in numerical] if name == 1303 else list(behavior)
        return list(desc["attrs"].get(name, []))

    # -- finalizing ----------------------------------------------------------------------------------
    def cudnnBackendFinalize(self, d: Any) -> int:
        desc = self._desc(d)
        if desc is None or desc["final"]:
            return BAD_PARAM
        kind, attrs = desc["type"], desc["attrs"]
        if any(need and k == kind and a not in attrs for a, (k, _, need) in ATTRS.items()):
            return BAD_PARAM
        check = {TENSOR: self._tensor_ok, GRAPH: self._graph_ok, ENGINE: self._engine_ok, ENGINEHEUR: self._heur_ok}
        check.update({PLAN: self._plan_ok, OP_POINTWISE: self._pointwise_ok, **{op: self._conv_ok for op in CONV_OPS}})
        status = check[kind](desc) if kind in check else SUCCESS
        if status == SUCCESS:
            desc["final"] = True
        return status

    def _tensor_ok(self, desc: dict) -> int:
        a = desc["attrs"]
        if len(a[902]) != 4 or len(a[903]) != 4 or a[901][0] not in (FLOAT, DOUBLE, HALF, BFLOAT16):
            return BAD_PARAM
        return SUCCESS

    def _t(self, key: int) -> dict:
        """A tensor descriptor's dims, strides, type, id and whether it is virtual."""
        a = self.objects[key]["attrs"]
        return {
            "dims": tuple(a[902]),
            "strides": tuple(a[903]),
            "dtype": a[901][0],
            "uid": a[906][0],
            "virtual": bool(a.get(907, [False])[0]),
        }

    def _conv_ok(self, desc: dict) -> int:
        first, a = FIRST[desc["type"]], desc["attrs"]
        conv = self.objects[a[first + 2][0]]["attrs"]
        w, x, y = (self._t(a[first + CONV_ROLES[r]][0]) for r in ("w", "x", "y"))
        (ph, pw), (sh, sw) = conv[105], conv[103]
        n, c, h, wd = x["dims"]
        k, cw, kh, kw = w["dims"]
        ho, wo = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
        if c != cw or y["dims"] != (n, k, ho, wo) or x["dtype"] != w["dtype"]:
            return BAD_PARAM
        if y["dtype"] != x["dtype"] and not y["virtual"]:
            return BAD_PARAM
        return SUCCESS

    def _pointwise_ok(self, desc: dict) -> int:
        a = desc["attrs"]
        mode = self.objects[a[750][0]]["attrs"][0][0]
        x, y = self._t(a[751][0]), self._t(a[753][0])
        if x["dims"] != y["dims"] or mode not in (PW_ADD, PW_RELU_FWD) or (mode == PW_ADD) != (752 in a):
            return BAD_PARAM if mode in (PW_ADD, PW_RELU_FWD) else NOT_SUPPORTED
        if 752 in a:
            b = self._t(a[752][0])
            if any(bd not in (1, yd) for bd, yd in zip(b["dims"], y["dims"])):
                return BAD_PARAM
        return SUCCESS

    def _graph_ok(self, desc: dict) -> int:
        """One chain: the convolution first, each pointwise operation reading the one before's output."""
        if self.objects.get(desc["attrs"][800][0], {}).get("kind") != "handle":
            return BAD_PARAM  # an operation graph is made on a handle (hence a GPU)
        ops = [self.objects[k] for k in desc["attrs"][801]]
        if ops[0]["type"] not in CONV_OPS or any(op["type"] != OP_POINTWISE for op in ops[1:]):
            return NOT_SUPPORTED
        first = FIRST[ops[0]["type"]]
        out = ops[0]["attrs"][first + CONV_ROLES["y"]][0]
        for op in ops[1:]:
            if op["attrs"][751][0] != out:
                return BAD_PARAM
            out = op["attrs"][753][0]
        desc["chain"] = ops
        desc["fused"] = len(ops) > 1
        return SUCCESS

    def _engine_problem(self, graph: dict, engine: int) -> tuple[int, Any]:
        """(status, (pass, layer, host algorithm, notes)) of an engine on a graph."""
        table = FUSED if graph["fused"] else PLAIN
        if engine not in table:
            return NOT_SUPPORTED, None
        conv_op = graph["chain"][0]
        pass_, first = CONV_OPS[conv_op["type"]], FIRST[conv_op["type"]]
        conv = self.objects[conv_op["attrs"][first + 2][0]]["attrs"]
        x, w = (self._t(conv_op["attrs"][first + CONV_ROLES[r]][0]) for r in ("x", "w"))
        n, c, h, wd = x["dims"]
        k, _, kh, kw = w["dims"]
        layer = vmem.nn.Conv2d(c, k, (kh, kw), tuple(conv[103]), tuple(conv[105]), bias=False)
        host, numerical, behavior = table[engine]
        if host not in host_algorithms(layer, (n, c, h, wd))[pass_]:
            return NOT_SUPPORTED, None
        return SUCCESS, (pass_, layer, host, (host, numerical, behavior))

    def _engine_ok(self, desc: dict) -> int:
        graph = self.objects[desc["attrs"][1300][0]]
        status, found = self._engine_problem(graph, desc["attrs"][1301][0])
        if status == SUCCESS:
            desc["engine"] = found[3]
        return status

    def _heur_ok(self, desc: dict) -> int:
        graph_key = desc["attrs"][201][0]
        graph = self.objects[graph_key]
        results = []
        for index in RANKING["fused" if graph["fused"] else "plain"]:
            if self._engine_problem(graph, index)[0] != SUCCESS:
                continue
            engine = {"kind": "backend", "type": ENGINE, "final": True, "attrs": {1300: [graph_key], 1301: [index]}}
            engine["engine"] = self._engine_problem(graph, index)[1][3]
            engine_key = next(self._ids) * 16
            self.objects[engine_key] = engine
            cfg = {"kind": "backend", "type": ENGINECFG, "final": True, "attrs": {300: [engine_key]}}
            cfg_key = next(self._ids) * 16
            self.objects[cfg_key] = cfg
            results.append(cfg_key)
        desc["results"] = results
        return SUCCESS

    def _plan_ok(self, desc: dict) -> int:
        engine = self.objects[self.objects[desc["attrs"][401][0]]["attrs"][300][0]]
        graph = self.objects.get(engine["attrs"][1300][0])
        if graph is None:
            return BAD_PARAM  # the operation graph was destroyed: its engines refer to freed memory
        if self.objects.get(desc["attrs"][400][0], {}).get("kind") != "handle":
            return BAD_PARAM
        status, found = self._engine_problem(graph, engine["attrs"][1301][0])
        if status != SUCCESS:
            return status
        pass_, layer, host, _ = found
        conv_op = graph["chain"][0]
        x = self._t(conv_op["attrs"][FIRST[conv_op["type"]] + CONV_ROLES["x"]][0])
        desc.update(graph=graph, engine=engine["engine"], pass_=pass_, layer=layer, host=host)
        desc["workspace"] = workspace_bytes(layer, x["dims"], pass_, host, 4)
        return SUCCESS

    # -- running a plan --------------------------------------------------------------------------------
    def _strided(self, t: dict, ptr: int) -> np.ndarray:
        """The tensor a descriptor and a pointer name, channels last (filters KRSC), over device memory."""
        from cupy import _state

        from .cudnn import _dtype

        dt = _dtype(t["dtype"])
        span = 1 + sum((d - 1) * s for d, s in zip(t["dims"], t["strides"]))
        region = _state.device_region(ptr, span * dt.itemsize, "a cuDNN graph tensor")
        strides = tuple(s * dt.itemsize for s in t["strides"])
        logical = np.ndarray(t["dims"], dt, buffer=region.buffer, offset=ptr - region.ptr, strides=strides)
        return logical.transpose(0, 2, 3, 1)

    def cudnnBackendExecute(self, h: Any, plan_ptr: Any, pack_ptr: Any) -> int:
        self._check_stream(h)
        plan, pack = self._desc(plan_ptr), self._desc(pack_ptr)
        if plan is None or pack is None or not (plan["final"] and pack["final"]):
            return BAD_PARAM
        bound = dict(zip(pack["attrs"][1000], pack["attrs"][1001]))
        graph = plan["graph"]
        tensors = {}
        for op in graph["chain"]:
            for attr, (_, type_, _) in ATTRS.items():
                if (
                    type_ == T_DESCRIPTOR
                    and attr in op["attrs"]
                    and self.objects[op["attrs"][attr][0]]["type"] == TENSOR
                ):
                    t = self._t(op["attrs"][attr][0])
                    tensors[t["uid"]] = t
        real = {u for u, t in tensors.items() if not t["virtual"]}
        if set(bound) != real:
            return BAD_PARAM  # every tensor of the graph in memory bound, and nothing else
        need = plan["workspace"]
        scratch = None
        if need:
            from cupy import _state

            ws = (pack["attrs"].get(1003) or [0])[0]
            region = _state.device_region(ws, need, "a cuDNN graph workspace")
            scratch = np.ndarray((need,), np.uint8, buffer=region.buffer, offset=ws - region.ptr)
        arrays = {u: self._strided(tensors[u], bound[u]) for u in real}
        conv_op, pass_ = graph["chain"][0], plan["pass_"]
        first = FIRST[conv_op["type"]]
        uid = {r: self._t(conv_op["attrs"][first + CONV_ROLES[r]][0])["uid"] for r in ("x", "w", "y")}
        written = {"forward": "y", "backward_data": "x", "backward_filter": "w"}[pass_]
        last = graph["chain"][-1]["attrs"][753][0] if graph["fused"] else None
        out = arrays[self._t(last)["uid"]] if last is not None else arrays[uid[written]]
        _, numerical, _ = plan["engine"]
        tensor_cores = "tensor_core" in numerical and tensors[uid["x"]]["dtype"] == FLOAT
        adds = [op["attrs"][752][0] for op in graph["chain"][1:] if 752 in op["attrs"]]
        bias = arrays[self._t(adds[0])["uid"]] if adds else None
        layer, host = plan["layer"], plan["host"]
        self.graph_runs.append((pass_, plan["engine"], graph["fused"]))

        def work() -> None:  # on the handle's stream: now, or when a graph that captured it runs
            from .cudnn import tf32

            f32 = {r: np.ascontiguousarray(arrays[uid[r]], np.float32) for r in ("x", "w", "y") if uid[r] in arrays}
            if tensor_cores:  # the inputs the pass reads, rounded to TF32
                f32 = {r: (v if r == written else tf32(v)) for r, v in f32.items()}
            shape = {
                "forward": out.shape,
                "backward_data": arrays[uid["x"]].shape,
                "backward_filter": arrays[uid["w"]].shape,
            }
            result = np.empty(shape[pass_], np.float32)
            ctx = Ctx(xp=np, ops=LaneOps(), algo=host, workspace=scratch)
            if pass_ == "forward":
                HostConv().forward(layer, ctx, f32["x"], f32["w"], result, None)
            elif pass_ == "backward_data":
                HostConv().backward(layer, ctx, f32["y"], None, f32["w"], result, None)
            else:
                HostConv().backward(layer, ctx, f32["y"], f32["x"], f32["w"], None, result)
            for op in graph["chain"][1:]:  # the pointwise operations, in FP32
                mode = self.objects[op["attrs"][750][0]]["attrs"][0][0]
                if mode == PW_ADD:
                    result += np.asarray(bias, np.float32).reshape(-1)
                else:
                    np.maximum(result, np.float32(0), out=result)
            out[...] = result.astype(out.dtype)  # rounded once into its storage type

        self._submit(h, work, f"graph:{pass_}:{'fused' if graph['fused'] else 'conv'}")
        return SUCCESS
