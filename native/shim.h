/* CPU shim for vmem's CUDA kernels: the same kernel sources compile as C99.
 *
 * __global__ and __device__ vanish and a kernel takes its thread index as its first parameter
 * (VMEM_TID_ARG); the launcher (cpu_launch.c) calls it once per thread of the grid in a plain loop, so
 * the compiler inlines and vectorizes it. Kernels must therefore be thread-independent: no
 * __syncthreads, no shared memory, no warp intrinsics.
 */
#ifndef VMEM_SHIM_H
#define VMEM_SHIM_H
#include <math.h>
#include <stdint.h>

#define __global__
#define __device__ static inline
#define __restrict__ restrict
#define VMEM_KERNEL static inline
#define VMEM_TID_ARG int64_t vmem_tid,
#define VMEM_TID vmem_tid
#define VMEM_FMUL(a, b) ((a) * (b))
#define VMEM_FADD(a, b) ((a) + (b))
#define VMEM_FDIV(a, b) ((a) / (b))
#define VMEM_RINT(a) rintf(a) /* round half to even in the default rounding mode, as numpy.rint */

static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline int __ffs(uint32_t v) { return __builtin_ffs((int)v); }  /* 1-based, 0 if none, as CUDA's */

/* Run kernel(tid, args...) for every tid in [lo, hi): the part of the grid one CPU thread runs. */
#define VMEM_LAUNCH(lo, hi, kernel, ...)                                   \
    do {                                                                   \
        for (int64_t vmem_t = (lo); vmem_t < (hi); ++vmem_t) kernel(vmem_t, __VA_ARGS__); \
    } while (0)
#endif
