"""The Program analyses policies share (vmem.graph.analysis): writers, readers, sparsity, prefetch points."""

from __future__ import annotations

import vmem
from vmem.graph.analysis import nonnegative_sparse, prefetch_points, readers, writers


def _program():
    return vmem.models.get("vgg_cifar", image_size=16).build(2)


def test_every_buffer_is_written_by_its_producer_first_then_in_place_layers():
    program = _program()
    chains = writers(program)
    for b, ops in chains.items():
        assert program.ops[ops[0]].index == program.tensors[b].producer or program.tensors[b].producer is None
        assert list(ops) == sorted(ops)
        assert all(program.tensors[program.ops[i].output].buffer == b for i in ops)
    assert sum(len(ops) for ops in chains.values()) == len(program.ops)


def test_readers_are_what_each_op_reads_forward_and_backward():
    program = _program()
    uses = readers(program)
    for op in program.ops:
        for t in op.inputs:
            assert op.index in uses[program.tensors[t].buffer]["forward"]
        for b in program.backward_reads(op):
            assert op.index in uses[b]["backward"]


def test_relu_outputs_and_their_max_pools_are_sparse_and_nonnegative():
    program = _program()
    kinds = {program.tensors[op.output].buffer: op.kind for op in program.ops}
    for b, kind in kinds.items():
        if kind == "relu":
            assert nonnegative_sparse(program, b)
        if kind == "conv":
            assert not nonnegative_sparse(program, b)


def test_prefetch_points_bring_back_every_offloaded_buffer_once():
    program = _program()
    offloaded = {b for b in program.stashed_buffers()}
    points = prefetch_points(program, offloaded)
    names = [n for batch in points.values() for n in batch]
    assert len(names) == len(set(names))
    needed = {program.tensors[b].name for op in program.ops for b in program.backward_reads(op) if b in offloaded}
    assert set(names) == needed


def test_the_recompute_graph_reads_sources_from_each_buffers_first_writer():
    from vmem.graph.analysis import RecomputeGraph

    program = _program()
    none, every = RecomputeGraph(program, set()), RecomputeGraph(program, {op.index for op in program.ops})
    assert none.cheap == set() and every.cheap == set(every.chains)
    for b, chain in every.chains.items():
        first = program.ops[chain[0]]
        assert set(every.sources[b]) == {program.tensors[t].buffer for t in first.inputs}
    assert every.stashed_bytes == sum(every.size[b] for b in every.stashed)
    frontier, temps, kept = every.reach(max(every.stashed), lambda s: True)
    assert not set(frontier) & set(temps) and not set(temps) & set(kept)
