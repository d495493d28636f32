/* CPU shim for vmem's CUDA kernels: the same kernel sources compile as C.
 *
 * __global__ and __device__ vanish; threadIdx, blockIdx, blockDim and gridDim are globals that the
 * serial launcher (cpu_launch.c) sets before calling a kernel once per thread. Kernels must therefore
 * be thread-independent: no __syncthreads, no shared memory, no warp intrinsics.
 */
#ifndef VMEM_SHIM_H
#define VMEM_SHIM_H
#include <stdint.h>

#define __global__
#define __device__ static inline
#define __restrict__ restrict

typedef struct { unsigned int x, y, z; } vmem_dim3;
static vmem_dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline int __ffs(uint32_t v) { return __builtin_ffs((int)v); }  /* 1-based, 0 if none, as CUDA's */

/* Run kernel(args...) for every thread of a 1-D grid of `blocks` blocks of `threads` threads. */
#define VMEM_LAUNCH(blocks, threads, kernel, ...)                                   \
    do {                                                                             \
        gridDim.x = (blocks); blockDim.x = (threads);                                \
        gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;                          \
        threadIdx.y = threadIdx.z = blockIdx.y = blockIdx.z = 0;                      \
        for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)                   \
            for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)           \
                kernel(__VA_ARGS__);                                                 \
    } while (0)
#endif
