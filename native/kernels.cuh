/* vmem's encoding kernels, shared by the GPU (cupy.RawModule) and the CPU (shim.h + cffi).
 *
 * Every kernel is thread-independent: one thread per output element, byte, word or row, no shared
 * memory, no synchronization. A kernel's first parameter is VMEM_TID_ARG: nothing on the GPU (the
 * thread index comes from blockIdx/threadIdx), the thread index on the CPU, where the launcher calls the
 * kernel in a plain loop that the compiler can vectorize. Multi-pass encodings (zero-value compression,
 * CSR) run as separate launches: count, an exclusive scan (cupy.cumsum or NumPy), then pack.
 *
 * Floating-point results must be the same bytes on both devices: products and sums that the NumPy
 * references round separately go through VMEM_FMUL/VMEM_FADD, which forbid nvcc's fused multiply-add.
 */
#if defined(__CUDACC_RTC__)  /* NVRTC (cupy.RawModule): no system headers */
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#if !defined(__CUDACC_RTC__)
#include <stdint.h>
#endif
#define VMEM_KERNEL extern "C" __global__
#define VMEM_TID_ARG
#define VMEM_TID ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define VMEM_FMUL(a, b) __fmul_rn((a), (b))
#define VMEM_FADD(a, b) __fadd_rn((a), (b))
#define VMEM_FDIV(a, b) __fdiv_rn((a), (b))
#define VMEM_RINT(a) rintf(a)
#else
#include "shim.h"
#endif

/* ---- binarize (Gist): bit i of byte b is x[8b + i] > 0 (numpy.packbits(bitorder="little")) ---------- */
VMEM_KERNEL void binarize_encode(VMEM_TID_ARG const float* __restrict__ x, uint8_t* __restrict__ bits, int64_t n) {
    int64_t b = VMEM_TID;
    if (b * 8 >= n) return;
    uint32_t byte = 0;
    if (b * 8 + 8 <= n) {
        for (int i = 0; i < 8; ++i) byte |= (uint32_t)(x[b * 8 + i] > 0.0f) << i;
    } else {
        for (int64_t j = b * 8; j < n; ++j) byte |= (uint32_t)(x[j] > 0.0f) << (j - b * 8);
    }
    bits[b] = (uint8_t)byte;
}

/* The sign mask as floats: 1 where x > 0, else 0. */
VMEM_KERNEL void binarize_decode(VMEM_TID_ARG const uint8_t* __restrict__ bits, float* __restrict__ out, int64_t n) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    out[j] = (float)((bits[j >> 3] >> (j & 7)) & 1u);
}

/* ReLU's backward on the encoded output: dx = dy * mask, the same product (and the same bytes, signed
 * zeros and NaN included) as dy * (y > 0) on the dense output. dx may be dy. */
VMEM_KERNEL void binarize_relu_backward(VMEM_TID_ARG const uint8_t* __restrict__ bits, const float* dy, float* dx,
                                        int64_t n) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    dx[j] = VMEM_FMUL(dy[j], (float)((bits[j >> 3] >> (j & 7)) & 1u));
}

/* ---- zero-value compression (cDMA): per 32 values a mask of nonzero bit patterns, then the nonzeros -- */
VMEM_KERNEL void zvc_mask(VMEM_TID_ARG const uint32_t* __restrict__ x, uint32_t* __restrict__ mask,
                          uint32_t* __restrict__ count, int64_t n) {
    int64_t g = VMEM_TID;
    if (g * 32 >= n) return;
    uint32_t m = 0;
    if (g * 32 + 32 <= n) {
        for (int i = 0; i < 32; ++i) m |= (uint32_t)(x[g * 32 + i] != 0u) << i;
    } else {
        for (int64_t j = g * 32; j < n; ++j) m |= (uint32_t)(x[j] != 0u) << (j - g * 32);
    }
    mask[g] = m;
    count[g] = (uint32_t)__popc(m);
}

VMEM_KERNEL void zvc_count(VMEM_TID_ARG const uint32_t* __restrict__ mask, uint32_t* __restrict__ count,
                           int64_t groups) {
    int64_t g = VMEM_TID;
    if (g >= groups) return;
    count[g] = (uint32_t)__popc(mask[g]);
}

/* Write each group's nonzeros at its offset (the exclusive scan of the counts). */
VMEM_KERNEL void zvc_pack(VMEM_TID_ARG const uint32_t* __restrict__ x, const uint32_t* __restrict__ mask,
                          const int64_t* __restrict__ offset, uint32_t* __restrict__ values, int64_t n) {
    int64_t g = VMEM_TID;
    if (g * 32 >= n) return;
    uint32_t m = mask[g];
    int64_t o = offset[g];
    while (m) {  /* the set bits only: no unpredictable branch per value */
        int i = __ffs(m) - 1;
        values[o++] = x[g * 32 + i];
        m &= m - 1;
    }
}

VMEM_KERNEL void zvc_unpack(VMEM_TID_ARG const uint32_t* __restrict__ mask, const int64_t* __restrict__ offset,
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

/* ---- SSDC (Gist): CSR over rows of 256 values, 1-byte column indices ------------------------------ */
VMEM_KERNEL void ssdc_count(VMEM_TID_ARG const uint32_t* __restrict__ x, int32_t* __restrict__ count, int64_t n) {
    int64_t r = VMEM_TID;
    if (r * 256 >= n) return;
    int64_t end = n - r * 256 < 256 ? n - r * 256 : 256;
    int32_t c = 0;
    for (int64_t i = 0; i < end; ++i) c += x[r * 256 + i] != 0u;
    count[r] = c;
}

VMEM_KERNEL void ssdc_pack(VMEM_TID_ARG const uint32_t* __restrict__ x, const int32_t* __restrict__ row_ptr,
                           uint8_t* __restrict__ cols, uint32_t* __restrict__ values, int64_t n) {
    int64_t r = VMEM_TID;
    if (r * 256 >= n) return;
    int64_t end = n - r * 256 < 256 ? n - r * 256 : 256;
    /* Branch-free compaction into the thread's own scratch (one slot past the last nonzero is written
     * too), then a copy into the row's slots: rows are packed in parallel without touching each other's. */
    uint32_t v_buf[257];
    uint8_t c_buf[257];
    int o = 0;
    for (int64_t i = 0; i < end; ++i) {
        uint32_t v = x[r * 256 + i];
        c_buf[o] = (uint8_t)i;
        v_buf[o] = v;
        o += v != 0u;
    }
    int64_t base = row_ptr[r];
    for (int k = 0; k < o; ++k) {
        cols[base + k] = c_buf[k];
        values[base + k] = v_buf[k];
    }
}

VMEM_KERNEL void ssdc_unpack(VMEM_TID_ARG const int32_t* __restrict__ row_ptr, const uint8_t* __restrict__ cols,
                             const uint32_t* __restrict__ values, uint32_t* __restrict__ out, int64_t n) {
    int64_t r = VMEM_TID;
    if (r * 256 >= n) return;
    int64_t end = n - r * 256 < 256 ? n - r * 256 : 256;
    for (int64_t i = 0; i < end; ++i) out[r * 256 + i] = 0u;
    for (int64_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) out[r * 256 + cols[k]] = values[k];
}

/* ---- delayed precision reduction: float32 bits <-> a 1-ebits-mbits code -----------------------------
 * Round to nearest even, no denormals (a signed zero), clamp to the largest finite value, NaN -> all-ones. */
__device__ uint32_t dpr_code(uint32_t bits, int ebits, int mbits) {
    uint32_t sign = bits >> 31, mag = bits & 0x7FFFFFFFu;
    int shift = 23 - mbits;
    int32_t bias = (1 << (ebits - 1)) - 1, top = (1 << ebits) - 1;
    uint32_t rounded = (mag + ((1u << (shift - 1)) - 1u) + ((mag >> shift) & 1u)) >> shift;  /* no overflow */
    int32_t e = (int32_t)(rounded >> mbits) - 127 + bias;
    uint32_t m = rounded & ((1u << mbits) - 1u);
    uint32_t full = (1u << mbits) - 1u;
    int over = e >= top, under = e <= 0, nan = mag > 0x7F800000u;
    e = nan ? top : (over ? top - 1 : (under ? 0 : e));
    m = nan ? full : (over ? full : (under ? 0u : m));
    return (sign << (ebits + mbits)) | ((uint32_t)e << mbits) | m;
}

__device__ uint32_t dpr_bits(uint32_t c, int ebits, int mbits) {
    uint32_t sign = (c >> (ebits + mbits)) & 1u;
    uint32_t e = (c >> mbits) & ((1u << ebits) - 1u), m = c & ((1u << mbits) - 1u);
    uint32_t bias = (1u << (ebits - 1)) - 1u, top = (1u << ebits) - 1u;
    uint32_t exp32 = e == 0u ? 0u : (e == top ? 255u : e - bias + 127u);
    uint32_t mant = e == 0u ? 0u : (e == top ? 0x7FFFFFu : m << (23 - mbits));
    return (sign << 31) | (exp32 << 23) | mant;
}

/* fp16 (1-5-10): one 16-bit code per value. */
VMEM_KERNEL void dpr16_encode(VMEM_TID_ARG const uint32_t* __restrict__ x, uint16_t* __restrict__ codes, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) codes[j] = (uint16_t)dpr_code(x[j], 5, 10);
}
VMEM_KERNEL void dpr16_decode(VMEM_TID_ARG const uint16_t* __restrict__ codes, uint32_t* __restrict__ out, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) out[j] = dpr_bits(codes[j], 5, 10);
}

/* fp8 (1-4-3): one byte per value (four to a 32-bit word). */
VMEM_KERNEL void dpr8_encode(VMEM_TID_ARG const uint32_t* __restrict__ x, uint8_t* __restrict__ codes, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) codes[j] = (uint8_t)dpr_code(x[j], 4, 3);
}
VMEM_KERNEL void dpr8_decode(VMEM_TID_ARG const uint8_t* __restrict__ codes, uint32_t* __restrict__ out, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) out[j] = dpr_bits(codes[j], 4, 3);
}

/* fp10 (1-5-4): three codes per 32-bit word, planar: with W = ceil(n / 3) words, word i holds the codes
 * of values i, i + W and i + 2W at bits 0, 10 and 20 (positions past n hold 0). One thread per word; each
 * of the three streams is read and written contiguously, so the loop vectorizes and a warp coalesces. */
VMEM_KERNEL void dpr10_encode(VMEM_TID_ARG const uint32_t* __restrict__ x, uint32_t* __restrict__ words, int64_t n) {
    int64_t i = VMEM_TID, w = (n + 2) / 3;
    if (i >= w) return;
    uint32_t word = dpr_code(x[i], 5, 4);
    if (i + w < n) word |= dpr_code(x[i + w], 5, 4) << 10;
    if (i + 2 * w < n) word |= dpr_code(x[i + 2 * w], 5, 4) << 20;
    words[i] = word;
}
/* dpr10_encode for the threads whose three values all exist (i < n - 2W), without the tests. */
VMEM_KERNEL void dpr10_encode_full(VMEM_TID_ARG const uint32_t* __restrict__ x, uint32_t* __restrict__ words,
                                   int64_t n) {
    int64_t i = VMEM_TID, w = (n + 2) / 3;
    words[i] = dpr_code(x[i], 5, 4) | (dpr_code(x[i + w], 5, 4) << 10) | (dpr_code(x[i + 2 * w], 5, 4) << 20);
}
VMEM_KERNEL void dpr10_decode(VMEM_TID_ARG const uint32_t* __restrict__ words, uint32_t* __restrict__ out, int64_t n) {
    int64_t i = VMEM_TID, w = (n + 2) / 3;
    if (i >= w) return;
    uint32_t word = words[i];
    out[i] = dpr_bits(word & 0x3FFu, 5, 4);
    if (i + w < n) out[i + w] = dpr_bits((word >> 10) & 0x3FFu, 5, 4);
    if (i + 2 * w < n) out[i + 2 * w] = dpr_bits((word >> 20) & 0x3FFu, 5, 4);
}
/* dpr10_decode for the threads whose three values all exist (i < n - 2W): no per-value test. The CPU runs
 * the _full kernels over the bulk of the grid: masked vector loads and stores are slow on some CPUs. */
VMEM_KERNEL void dpr10_decode_full(VMEM_TID_ARG const uint32_t* __restrict__ words, uint32_t* __restrict__ out,
                                   int64_t n) {
    int64_t i = VMEM_TID, w = (n + 2) / 3;
    uint32_t word = words[i];
    out[i] = dpr_bits(word & 0x3FFu, 5, 4);
    out[i + w] = dpr_bits((word >> 10) & 0x3FFu, 5, 4);
    out[i + 2 * w] = dpr_bits((word >> 20) & 0x3FFu, 5, 4);
}

/* ---- fixed point: per-channel uniform quantization between lo and lo + levels * scale -------------
 * Channel of value j: (j / inner) % channels (NCHW: inner = H*W; channels last: inner = 1). Codes are
 * packed 8 / bits to a byte, low bits first; one thread per byte. Non-finite values get code 0. */
__device__ uint32_t fixed_code(float v, float lo, float scale, uint32_t levels) {
    float safe = scale > 0.0f ? scale : 1.0f;
    int finite = (v - v) == 0.0f;  /* false for NaN and infinities */
    float q = VMEM_RINT(VMEM_FDIV(finite ? v - lo : 0.0f - lo, safe));
    q = q < 0.0f ? 0.0f : (q > (float)levels ? (float)levels : q);
    return finite ? (uint32_t)q : 0u;
}

VMEM_KERNEL void fixed_encode(VMEM_TID_ARG const float* __restrict__ x, const float* __restrict__ lo,
                              const float* __restrict__ scale, uint8_t* __restrict__ codes, int64_t n,
                              int64_t inner, int64_t channels, int bits) {
    int64_t b = VMEM_TID;
    int per = 8 / bits;
    if (b * per >= n) return;
    uint32_t out = 0, levels = (1u << bits) - 1u;
    for (int i = 0; i < per; ++i) {
        int64_t j = b * per + i;
        if (j < n) {
            int64_t c = (j / inner) % channels;
            out |= fixed_code(x[j], lo[c], scale[c], levels) << (bits * i);
        }
    }
    codes[b] = (uint8_t)out;
}

VMEM_KERNEL void fixed_decode(VMEM_TID_ARG const uint8_t* __restrict__ codes, const float* __restrict__ lo,
                              const float* __restrict__ scale, float* __restrict__ out, int64_t n,
                              int64_t inner, int64_t channels, int bits) {
    int64_t j = VMEM_TID;
    if (j >= n) return;
    int per = 8 / bits;
    int64_t c = (j / inner) % channels;
    uint32_t q = (codes[j / per] >> (bits * (j % per))) & ((1u << bits) - 1u);
    out[j] = VMEM_FADD(lo[c], VMEM_FMUL((float)q, scale[c]));
}
