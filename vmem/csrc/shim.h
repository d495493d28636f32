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
#include <string.h>

#define __global__
#define __device__ static inline
#define __restrict__ restrict
#define VMEM_KERNEL static inline
#define VMEM_TID_ARG int64_t vmem_tid,
#define VMEM_TID vmem_tid
#define VMEM_TID2_ARG int64_t vmem_row, int64_t vmem_col,
#define VMEM_ROW(cols) vmem_row
#define VMEM_COL(cols) vmem_col
#define VMEM_FMUL(a, b) ((a) * (b))
#define VMEM_FADD(a, b) ((a) + (b))
#define VMEM_FDIV(a, b) ((a) / (b))
#define VMEM_UNROLL _Pragma("GCC unroll 4")
#define VMEM_RINT(a) rintf(a) /* round half to even in the default rounding mode, as numpy.rint */
#define VMEM_FSQRT(a) sqrtf(a)  /* correctly rounded (IEEE), as NumPy's float32 sqrt */

static inline uint32_t vmem_fbits(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float vmem_bitsf(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }
#define VMEM_FBITS(v) vmem_fbits(v)
#define VMEM_BITSF(b) vmem_bitsf(b)

static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline int __ffs(uint32_t v) { return __builtin_ffs((int)v); }  /* 1-based, 0 if none, as CUDA's */

/* Run kernel(tid, args...) for every tid in [lo, hi): the part of the grid one CPU thread runs. */
#define VMEM_LAUNCH(lo, hi, kernel, ...)                                   \
    do {                                                                   \
        for (int64_t vmem_t = (lo); vmem_t < (hi); ++vmem_t) kernel(vmem_t, __VA_ARGS__); \
    } while (0)

/* Run a 2-D kernel for rows [lo, hi) of its grid, every column of each: the inner loop vectorizes. */
#define VMEM_LAUNCH2(lo, hi, cols, kernel, ...)                                          \
    do {                                                                                 \
        int64_t vmem_cols = (cols);                                                      \
        for (int64_t vmem_r = (lo); vmem_r < (hi); ++vmem_r)                             \
            for (int64_t vmem_c = 0; vmem_c < vmem_cols; ++vmem_c) kernel(vmem_r, vmem_c, __VA_ARGS__); \
    } while (0)
#endif
