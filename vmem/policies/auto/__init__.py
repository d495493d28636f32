"""``auto``: one planner over every technique, for the device's budget.

Within the budget it looks for the plan with the least predicted step time, deciding per stashed buffer
keep, offload (raw or through a lossless codec), encode on the device or recompute, and per convolution
pass its algorithm. It gathers starting plans three ways, then improves the fastest that fits; every
candidate is verified by the planner's replay through the real pool (fragmentation included) and priced
by the cost model (the roofline on a simulated GPU, the measured profile on the CPU device):

1. **Portfolio.** Every named technique, each with the fastest algorithms and with the leanest: layer-wise
   allocation, vDNN's ``vdnn-conv`` and ``vdnn-all`` (both sync modes, raw and through zero-value
   compression), ``vdnn-dyn`` (without its keep search: the improvement's moves make the same choices,
   from whichever start is fastest), Gist's lossless encodings, and recomputation (``echo``, ``mirror``,
   ``chen``). So ``auto`` fits wherever one of them does and is never slower than the fastest of them
   (vdnn-dyn's search is left out on graphs of more than ``DYN_OPS`` ops: the descent covers its choices).
2. **Exhaustive**, on small graphs: where the stashed buffers' ways (below) make at most ``EXHAUSTIVE``
   plans, every one is replayed (its offloads held until their copies end, else released at once), so the
   start is exact there.
3. **Descent.** From the fastest plan (layer-wise, fastest algorithms), while it does not fit: the replay
   says where the peak is; of the kept buffers live there, take the ways to store them with the least
   estimated seconds per byte saved until they cover the excess, and replay again. The ways: recompute
   (from what the plan holds, cheap temporaries rebuilt with it: its producer's forward time), encode
   losslessly (ssdc, binarize: the kernels' time), offload raw or through zvc (what the prefetch cannot
   hide behind the backward ahead of its reader, while the copies out, queued in forward order, end
   before the peak). Each offloaded block is held until its copy is expected to end (``Plan.release``,
   :meth:`_Info.held`), as far as the forward has room for it, so that the forward never waits to reuse
   it; where that does not lower the peak, released at once. Held blocks cost the forward memory, so up
   to four descents run, the copies out given all, half, a quarter or none of the time before the peak
   (``LINK_SHARES``; the next only where the last fitted). ``solver=ilp`` adds
   descents whose rounds are integer programs (SciPy's HiGHS, ``time_limit`` seconds each): the least
   estimated seconds that save the excess.

Then the **improvement**: moves that mix the techniques, ranked by a cheap estimate of the time they save
and tried in that order, each kept only where the replayed plan still fits and is faster: a recomputed
buffer kept, or offloaded instead (the copy hides behind compute where recomputing it would not); an
offloaded or encoded buffer kept; a raw offload sent through zero-value compression (for buffers of ReLU
outputs); a convolution pass given a faster algorithm. ``trials`` bounds the replays (by default
``MAX_TRIALS``, fewer on graphs of more than ``REPLAY_OPS / MAX_TRIALS`` ops).

``offload=off`` keeps, encodes and recomputes only (no named vDNN start, no offload in the descent, the
exhaustive search or the moves): for a link that is busy (data parallel over PCIe) or host memory that is
scarce; its refusal names the least budget of the leanest plan that sends nothing to the host.

Lossless by default (the plan trains bitwise like ``baseline``). ``lossy=`` admits one lossy codec as well
(``fp16``, ``fp10``, ``fp8``, ``fixed8``, ``fixed4``, ``patch2``): Gist with it, and offloads through it.
The plan's ``chosen`` names the start, its ``reason`` summarises (what it keeps, offloads, encodes and
recomputes, counted), and ``notes`` says per buffer or pass what each accepted move changed and what it
saved. Where nothing of that fits, the floor with the sign bits a split convolution keeps for a later
ReLU sent to the host (``LEANEST``: its copies cost time, so it is the last resort); where that does not fit
either, BudgetTooSmall with its least budget.
"""

from .estimates import codec_offloads
from .policy import DESCENT, EXHAUSTIVE, FAST, FLOOR, ILP_DESCENT, LEANEST, LOSSY, NAMED, PORTFOLIO, SOLVERS, Auto

__all__ = [
    "Auto",
    "FLOOR",
    "LEANEST",
    "PORTFOLIO",
    "NAMED",
    "LOSSY",
    "SOLVERS",
    "FAST",
    "DESCENT",
    "ILP_DESCENT",
    "EXHAUSTIVE",
    "codec_offloads",
]
