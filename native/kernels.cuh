/* vmem's encoding kernels, shared by the GPU (cupy.RawModule) and the CPU (shim.h + cffi).
 * One thread per output element or per 32-value group; no synchronization between threads.
 * Multi-pass encodings (zero-value compression) run as separate launches: mask and count, a scan on
 * the host or with cupy.cumsum, then pack.
 */
#if defined(__CUDACC_RTC__)  /* NVRTC (cupy.RawModule): no system headers */
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define VMEM_KERNEL extern "C" __global__
#elif defined(__CUDACC__)  /* nvcc */
#include <stdint.h>
#define VMEM_KERNEL extern "C" __global__
#else
#include "shim.h"
#define VMEM_KERNEL static inline  /* inlined into the serial launcher's loops */
#endif

#define VMEM_TID ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)

/* binarize: bit i of byte b is x[8b + i] > 0 (little-endian bit order, as numpy.packbits(bitorder="little")). */
VMEM_KERNEL void binarize_encode(const float* __restrict__ x, uint8_t* __restrict__ bits, int64_t n) {
    int64_t b = VMEM_TID;
    if (b * 8 >= n) return;
    uint8_t byte = 0;
    for (int i = 0; i < 8; ++i) {
        int64_t j = b * 8 + i;
        if (j < n && x[j] > 0.0f) byte |= (uint8_t)(1u << i);
    }
    bits[b] = byte;
}

VMEM_KERNEL void binarize_decode(const uint8_t* __restrict__ bits, float* __restrict__ out, int64_t n) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    out[j] = (float)((bits[j >> 3] >> (j & 7)) & 1u);  /* branch-free: ReLU masks are unpredictable */
}

/* zero-value compression, pass 1: one thread per 32 values: the mask of nonzero bit patterns and its count. */
VMEM_KERNEL void zvc_mask(const uint32_t* __restrict__ x, uint32_t* __restrict__ mask,
                                    uint32_t* __restrict__ count, int64_t n) {
    int64_t g = VMEM_TID;
    if (g * 32 >= n) return;
    uint32_t m = 0;
    for (int i = 0; i < 32; ++i) {
        int64_t j = g * 32 + i;
        if (j < n && x[j] != 0u) m |= 1u << i;
    }
    mask[g] = m;
    count[g] = (uint32_t)__popc(m);
}

/* pass 3: write each group's nonzeros at its offset (the exclusive scan of the counts). */
VMEM_KERNEL void zvc_pack(const uint32_t* __restrict__ x, const uint32_t* __restrict__ mask,
                                    const int64_t* __restrict__ offset, uint32_t* __restrict__ values, int64_t n) {
    int64_t g = VMEM_TID;
    if (g * 32 >= n) return;
    uint32_t m = mask[g];
    int64_t o = offset[g];
    while (m) {  /* visit the set bits only: no unpredictable branch per value */
        int i = __ffs(m) - 1;
        values[o++] = x[g * 32 + i];
        m &= m - 1;
    }
}

VMEM_KERNEL void zvc_unpack(const uint32_t* __restrict__ mask, const int64_t* __restrict__ offset,
                                      const uint32_t* __restrict__ values, uint32_t* __restrict__ out, int64_t n) {
    int64_t g = VMEM_TID;
    if (g * 32 >= n) return;
    uint32_t m = mask[g];
    int64_t o = offset[g];
    int64_t end = n - g * 32 < 32 ? n - g * 32 : 32;
    for (int64_t i = 0; i < end; ++i) out[g * 32 + i] = 0u;
    while (m) {
        int i = __ffs(m) - 1;
        out[g * 32 + i] = values[o++];
        m &= m - 1;
    }
}

/* delayed precision reduction: float32 bits -> a 1-ebits-mbits code; round to nearest even, no
 * denormals (flush to a signed zero), clamp to the largest finite value, NaN -> all-ones. */
VMEM_KERNEL void dpr_encode(const uint32_t* __restrict__ x, uint16_t* __restrict__ codes, int64_t n,
                                      int ebits, int mbits) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    uint32_t bits = x[j];
    uint32_t sign = bits >> 31, mag = bits & 0x7FFFFFFFu;
    int shift = 23 - mbits;
    int bias = (1 << (ebits - 1)) - 1, top = (1 << ebits) - 1;
    int64_t e;
    int64_t m;
    if (mag > 0x7F800000u) {
        e = top;
        m = (1 << mbits) - 1;
    } else {
        uint64_t rounded = ((uint64_t)mag + ((1u << (shift - 1)) - 1) + ((mag >> shift) & 1u)) >> shift;
        e = (int64_t)(rounded >> mbits) - 127 + bias;
        m = (int64_t)(rounded & ((1u << mbits) - 1));
        if (e >= top) { e = top - 1; m = (1 << mbits) - 1; }
        else if (e <= 0) { e = 0; m = 0; }
    }
    codes[j] = (uint16_t)((sign << (ebits + mbits)) | ((uint32_t)e << mbits) | (uint32_t)m);
}

VMEM_KERNEL void dpr_decode(const uint16_t* __restrict__ codes, uint32_t* __restrict__ out, int64_t n,
                                      int ebits, int mbits) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    uint32_t c = codes[j];
    uint32_t sign = (c >> (ebits + mbits)) & 1u;
    uint32_t e = (c >> mbits) & ((1u << ebits) - 1), m = c & ((1u << mbits) - 1);
    uint32_t bias = (1u << (ebits - 1)) - 1, top = (1u << ebits) - 1;
    uint32_t exp32 = e == 0 ? 0 : (e == top ? 255u : e - bias + 127u);
    uint32_t mant = e == 0 ? 0 : (e == top ? 0x7FFFFFu : m << (23 - mbits));
    out[j] = (sign << 31) | (exp32 << 23) | mant;
}
