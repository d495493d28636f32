/* vmem's encoding kernels, shared by the GPU (cupy.RawModule) and the CPU (shim.h + cffi).
 *
 * Every kernel is thread-independent: one thread per output element, byte, word or row, no shared memory, no
 * synchronization. A kernel's first parameter is VMEM_TID_ARG: nothing on the GPU (the thread index comes
 * from blockIdx/threadIdx), the thread index on the CPU, where the launcher calls the kernel in a plain loop
 * that the compiler can vectorize. Kernels over a rows x cols grid (VMEM_TID2_ARG, VMEM_ROW, VMEM_COL; col
 * fastest) get both indices from the CPU launcher's two loops, so the inner loop over columns (channels, say)
 * vectorizes with no division; the GPU divides its flat index. Multi-pass encodings (zero-value compression,
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
#define VMEM_TID2_ARG
#define VMEM_ROW(cols) vmem_row(cols)
#define VMEM_COL(cols) (VMEM_TID - vmem_row(cols) * (cols))
#define VMEM_FMUL(a, b) __fmul_rn((a), (b))
#define VMEM_FADD(a, b) __fadd_rn((a), (b))
#define VMEM_FDIV(a, b) __fdiv_rn((a), (b))
#define VMEM_RINT(a) rintf(a)
#define VMEM_FSQRT(a) __fsqrt_rn(a)
#define VMEM_UNROLL _Pragma("unroll")
#define VMEM_FBITS(v) __float_as_uint(v)
#define VMEM_BITSF(b) __uint_as_float(b)
#else
#include "shim.h"
#endif
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
/* a / b for 0 <= a < 2^53 and 0 < b without a 64-bit integer division (on the GPU a long software
 * sequence): the quotient of the doubles, off by at most one, corrected. Only where an index does not fit
 * 32 bits (a feature map of 2^31 values or more); every other path divides in 32 bits. */
__device__ __forceinline__ int64_t vmem_div64(int64_t a, int64_t b) {
    int64_t q = (int64_t)((double)a / (double)b);
    if (q * b > a) --q;
    else if ((q + 1) * b <= a) ++q;
    return q;
}
/* A 2-D grid's row from the flat thread index: a 32-bit division where both fit. */
__device__ __forceinline__ int64_t vmem_row(int64_t cols) {
    int64_t t = VMEM_TID;
    return (t <= 0xffffffffLL && cols <= 0xffffffffLL) ? (int64_t)((uint32_t)t / (uint32_t)cols)
                                                       : vmem_div64(t, cols);
}
/* a / b for 0 <= a and 0 < b: in 32 bits where both fit. */
__device__ __forceinline__ int64_t vmem_div(int64_t a, int64_t b) {
    return (a <= 0xffffffffLL && b <= 0xffffffffLL) ? (int64_t)((uint32_t)a / (uint32_t)b) : vmem_div64(a, b);
}
#else
static inline int64_t vmem_div64(int64_t a, int64_t b) { return a / b; }
static inline int64_t vmem_div(int64_t a, int64_t b) { return a / b; }
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
/* Floats as integers in the same order (-0 just below +0; NaN above +inf or below -inf by sign), and
 * back. Quantization clamps and selects on these keys: integer min, max and selects, which the CPU
 * vectorizes, where floating-point selects would become branches (compilers do not speculate
 * floating-point operations that may trap). */
__device__ int32_t float_key(float v) {
    uint32_t b = VMEM_FBITS(v);
    return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7FFFFFFFu));
}
__device__ float key_float(int32_t k) {
    return VMEM_BITSF((uint32_t)k ^ ((uint32_t)(k >> 31) & 0x7FFFFFFFu));
}
__device__ int32_t finite_mask(float v) {  /* all ones if v is finite, else 0 */
    return -(int32_t)((VMEM_FBITS(v) & 0x7F800000u) != 0x7F800000u);
}

/* The code of v: rint((v - lo) / scale) clamped to [0, levels] (scale 0: divide by 1); 0 if v is not finite. */
__device__ uint32_t fixed_code(float v, float lo, float scale, uint32_t levels) {
    int32_t ks = float_key(scale), one = float_key(1.0f);
    float safe = key_float(ks > 0 ? ks : one);
    int32_t kq = float_key(VMEM_RINT(VMEM_FDIV(v - lo, safe)));  /* NaN or infinite when v is not */
    int32_t top = float_key((float)levels);
    kq = kq < 0 ? 0 : kq;  /* key 0 is +0 */
    kq = kq > top ? top : kq;
    return (uint32_t)key_float(kq & finite_mask(v));
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

/* Channels last, rows of whole bytes (channels a multiple of 8 / bits: a byte never spans two rows): a
 * grid of rows = positions by cols = bytes per row, no division; the CPU's loop over bytes vectorizes. */
__device__ void fixed_encode_row(int64_t row, int64_t b, const float* x, const float* lo, const float* scale,
                                 uint8_t* codes, int64_t channels, int bits) {
    int per = 8 / bits;
    uint32_t out = 0, levels = (1u << bits) - 1u;
    VMEM_UNROLL
    for (int i = 0; i < per; ++i) {
        int64_t ch = b * per + i;
        out |= fixed_code(x[row * channels + ch], lo[ch], scale[ch], levels) << (bits * i);
    }
    codes[row * (channels / per) + b] = (uint8_t)out;
}

__device__ void fixed_decode_row(int64_t row, int64_t b, const uint8_t* codes, const float* lo, const float* scale,
                                 float* out, int64_t channels, int bits) {
    int per = 8 / bits;
    uint32_t byte = codes[row * (channels / per) + b], mask = (1u << bits) - 1u;
    VMEM_UNROLL
    for (int i = 0; i < per; ++i) {
        int64_t ch = b * per + i;
        float q = (float)(int32_t)((byte >> (bits * i)) & mask);  /* from int: AVX2 converts it */
        out[row * channels + ch] = VMEM_FADD(lo[ch], VMEM_FMUL(q, scale[ch]));
    }
}

VMEM_KERNEL void fixed8_encode_rows(VMEM_TID2_ARG const float* __restrict__ x, const float* __restrict__ lo,
                                    const float* __restrict__ scale, uint8_t* __restrict__ codes, int64_t rows,
                                    int64_t channels) {
    int64_t row = VMEM_ROW(channels), b = VMEM_COL(channels);
    if (row < rows) fixed_encode_row(row, b, x, lo, scale, codes, channels, 8);
}
VMEM_KERNEL void fixed4_encode_rows(VMEM_TID2_ARG const float* __restrict__ x, const float* __restrict__ lo,
                                    const float* __restrict__ scale, uint8_t* __restrict__ codes, int64_t rows,
                                    int64_t channels) {
    int64_t row = VMEM_ROW(channels / 2), b = VMEM_COL(channels / 2);
    if (row < rows) fixed_encode_row(row, b, x, lo, scale, codes, channels, 4);
}
VMEM_KERNEL void fixed8_decode_rows(VMEM_TID2_ARG const uint8_t* __restrict__ codes, const float* __restrict__ lo,
                                    const float* __restrict__ scale, float* __restrict__ out, int64_t rows,
                                    int64_t channels) {
    int64_t row = VMEM_ROW(channels), b = VMEM_COL(channels);
    if (row < rows) fixed_decode_row(row, b, codes, lo, scale, out, channels, 8);
}
VMEM_KERNEL void fixed4_decode_rows(VMEM_TID2_ARG const uint8_t* __restrict__ codes, const float* __restrict__ lo,
                                    const float* __restrict__ scale, float* __restrict__ out, int64_t rows,
                                    int64_t channels) {
    int64_t row = VMEM_ROW(channels / 2), b = VMEM_COL(channels / 2);
    if (row < rows) fixed_decode_row(row, b, codes, lo, scale, out, channels, 4);
}

/* ---- patch2: 2 bits per value, four levels between the min and max of each 4x4 spatial patch ---------
 * Input channels last (N, H, W, C). One thread per (patch, channel) on a grid of rows = N * ceil(H/4) *
 * ceil(W/4) patches (image, patch row, patch column) by cols = C: adjacent threads read adjacent channels.
 * Per patch a 32-bit word of codes (value (i, j) of the patch at bits 2 * (4i + j); positions past the
 * edge hold 0), the patch's lo and its scale (hi - lo) / 3 over the finite values (0 and 0 if none). */
__device__ void patch2_extent(int64_t row, int64_t h, int64_t w, int64_t* base, int* rows, int* cols) {
    int64_t ph = (h + 3) / 4, pw = (w + 3) / 4;
    int64_t img = row / (ph * pw), pr = (row / pw) % ph, pc = row % pw;
    *rows = h - pr * 4 < 4 ? (int)(h - pr * 4) : 4;
    *cols = w - pc * 4 < 4 ? (int)(w - pc * 4) : 4;
    *base = (img * h + pr * 4) * w + pc * 4;  /* the patch's first pixel */
}

/* The patch's range over its finite values and its codes: helpers that the encoder calls with rows = cols
 * = 4 for whole patches (constant trip counts: unrolled, and the CPU's loop over channels vectorizes) and
 * with the actual extent at the bottom and right edges. */
__device__ void patch2_range(const float* p, int64_t w, int64_t c, int rows, int cols, float* lo, float* hi) {
    int32_t l = 0x7FFFFFFF, h = -0x7FFFFFFF - 1;
    VMEM_UNROLL
    for (int i = 0; i < rows; ++i) {
        VMEM_UNROLL
        for (int j = 0; j < cols; ++j) {
            float v = p[(i * w + j) * c];
            int32_t k = float_key(v), finite = finite_mask(v);
            int32_t kl = (k & finite) | (0x7FFFFFFF & ~finite), kh = (k & finite) | ((-0x7FFFFFFF - 1) & ~finite);
            l = kl < l ? kl : l;
            h = kh > h ? kh : h;
        }
    }
    int32_t some = -(int32_t)(l <= h);  /* no finite value: 0 and 0 */
    *lo = key_float(l & some);
    *hi = key_float(h & some);
}

__device__ uint32_t patch2_word(const float* p, int64_t w, int64_t c, int rows, int cols, float lo, float scale) {
    uint32_t word = 0;
    VMEM_UNROLL
    for (int i = 0; i < rows; ++i)
        VMEM_UNROLL
        for (int j = 0; j < cols; ++j) word |= fixed_code(p[(i * w + j) * c], lo, scale, 3u) << (2 * (4 * i + j));
    return word;
}

__device__ void patch2_encode_at(const float* x, uint32_t* codes, float* lo_out, float* scale_out, int64_t row,
                                 int64_t ch, int64_t base, int64_t w, int64_t c, int rows, int cols) {
    const float* p = x + base * c + ch;
    float lo, hi;
    patch2_range(p, w, c, rows, cols, &lo, &hi);
    float scale = VMEM_FDIV(hi - lo, 3.0f);
    codes[row * c + ch] = patch2_word(p, w, c, rows, cols, lo, scale);
    lo_out[row * c + ch] = lo;
    scale_out[row * c + ch] = scale;
}

/* Whether patch ``row`` lies wholly inside the image (4x4 values). */
__device__ int patch2_whole(int64_t row, int64_t h, int64_t w) {
    int64_t base;
    int rows, cols;
    patch2_extent(row, h, w, &base, &rows, &cols);
    return rows == 4 && cols == 4;
}

VMEM_KERNEL void patch2_encode(VMEM_TID2_ARG const float* __restrict__ x, uint32_t* __restrict__ codes,
                               float* __restrict__ lo, float* __restrict__ scale, int64_t n, int64_t h, int64_t w,
                               int64_t c) {
    int64_t row = VMEM_ROW(c), base;
    int rows, cols;
    if (row >= n * ((h + 3) / 4) * ((w + 3) / 4)) return;
    patch2_extent(row, h, w, &base, &rows, &cols);
    patch2_encode_at(x, codes, lo, scale, row, VMEM_COL(c), base, w, c, rows, cols);
}

/* patch2_encode for rows whose patch is whole (patch2_whole): constant 4x4 loops, unrolled; the CPU
 * launcher runs it for whole patches so that its loop over channels vectorizes. */
VMEM_KERNEL void patch2_encode_whole(VMEM_TID2_ARG const float* __restrict__ x, uint32_t* __restrict__ codes,
                                     float* __restrict__ lo, float* __restrict__ scale, int64_t n, int64_t h,
                                     int64_t w, int64_t c) {
    int64_t row = VMEM_ROW(c), base;
    int rows, cols;
    patch2_extent(row, h, w, &base, &rows, &cols);
    patch2_encode_at(x, codes, lo, scale, row, VMEM_COL(c), base, w, c, 4, 4);
}

/* One thread per value, on a grid of rows = N * H * W pixels by cols = C channels: adjacent threads write
 * adjacent values and read adjacent patches' codes. */
VMEM_KERNEL void patch2_decode(VMEM_TID2_ARG const uint32_t* __restrict__ codes, const float* __restrict__ lo,
                               const float* __restrict__ scale, float* __restrict__ x, int64_t n, int64_t h,
                               int64_t w, int64_t c) {
    int64_t pix = VMEM_ROW(c), ch = VMEM_COL(c);
    int64_t img = pix / (h * w), y = (pix / w) % h, col = pix % w;  /* before the test: the CPU hoists it */
    if (pix >= n * h * w) return;
    int64_t k = ((img * ((h + 3) / 4) + y / 4) * ((w + 3) / 4) + col / 4) * c + ch;
    uint32_t q = (codes[k] >> (2 * (4 * (y % 4) + col % 4))) & 3u;
    x[pix * c + ch] = VMEM_FADD(lo[k], VMEM_FMUL((float)(int32_t)q, scale[k]));  /* int: AVX2 converts it */
}

/* ==== Layers' element-wise kernels, in place, in fp32, fp16 and bf16 =====================================
 * Half-precision values travel as their bits (uint16_t) and compute in FP32: vmem_h2f/vmem_f2h convert as
 * NumPy's float16 casts do (round half to even, subnormals kept, NaN payloads kept), vmem_bf2f/vmem_f2bf as
 * ml_dtypes' bfloat16 (round half to even, subnormals kept, NaN made the quiet NaN of its sign). The same
 * bit operations run on both devices, so the bytes are the same. ReLU is NumPy's maximum(v, 0): NaN passes,
 * -0 becomes +0; its backward dy * (y > 0) keeps the product's sign and NaN. */
__device__ float vmem_h2f(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, exp = h & 0x7c00u, sig = h & 0x03ffu;
    if (exp == 0x7c00u) return VMEM_BITSF(sign + 0x7f800000u + (sig << 13));  /* inf or NaN */
    if (exp != 0) return VMEM_BITSF(sign + (((uint32_t)(h & 0x7fffu) + 0x1c000u) << 13));
    if (sig == 0) return VMEM_BITSF(sign);
    int shift = 0;  /* a subnormal half is a normal float */
    sig <<= 1;
    while ((sig & 0x0400u) == 0) { sig <<= 1; ++shift; }
    return VMEM_BITSF(sign + ((uint32_t)(127 - 15 - shift) << 23) + ((sig & 0x03ffu) << 13));
}

__device__ uint16_t vmem_f2h(float v) {
    uint32_t f = VMEM_FBITS(v), exp = f & 0x7f800000u, sig;
    uint16_t sign = (uint16_t)((f & 0x80000000u) >> 16);
    if (exp >= 0x47800000u) {  /* too large: infinity; or infinity or NaN already */
        sig = f & 0x007fffffu;
        if (exp == 0x7f800000u && sig != 0) {
            uint16_t nan = (uint16_t)(0x7c00u + (sig >> 13));
            return (uint16_t)(sign + (nan == 0x7c00u ? nan + 1 : nan));
        }
        return (uint16_t)(sign + 0x7c00u);
    }
    if (exp <= 0x38000000u) {  /* a subnormal half, or zero */
        if (exp < 0x33000000u) return sign;
        uint32_t e = exp >> 23;
        sig = 0x00800000u + (f & 0x007fffffu);
        sig >>= (113 - e);
        if (((sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu)) sig += 0x00001000u;
        return (uint16_t)(sign + (sig >> 13));
    }
    sig = f & 0x007fffffu;
    if ((sig & 0x00003fffu) != 0x00001000u) sig += 0x00001000u;  /* round half to even */
    return (uint16_t)(sign + (uint16_t)((exp - 0x38000000u) >> 13) + (uint16_t)(sig >> 13));
}

__device__ float vmem_bf2f(uint16_t b) { return VMEM_BITSF((uint32_t)b << 16); }

__device__ uint16_t vmem_f2bf(float v) {
    uint32_t f = VMEM_FBITS(v);
    if ((f & 0x7fffffffu) > 0x7f800000u) return (f & 0x80000000u) ? 0xffc0u : 0x7fc0u;  /* NaN */
    return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

__device__ float vmem_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

/* Bias + ReLU over a convolution's channels-last output, in place: y = max(y + b[channel], 0), on a grid
 * of rows = N * H * W pixels by cols = C channels; b in FP32 (the master weights' type). */
VMEM_KERNEL void bias_relu_f32(VMEM_TID2_ARG float* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = vmem_relu(VMEM_FADD(y[r * c + ch], b[ch]));
}
VMEM_KERNEL void bias_relu_f16(VMEM_TID2_ARG uint16_t* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = vmem_f2h(vmem_relu(VMEM_FADD(vmem_h2f(y[r * c + ch]), b[ch])));
}
VMEM_KERNEL void bias_relu_bf16(VMEM_TID2_ARG uint16_t* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = vmem_f2bf(vmem_relu(VMEM_FADD(vmem_bf2f(y[r * c + ch]), b[ch])));
}

/* A batch's input map from NCHW float32 (as the host holds it, copied whole) into the network's channels-last
 * input in its storage type, on a grid of rows = N * H * W pixels by cols = C channels: y[r][ch] =
 * x[b][ch][p] with r = b * hw + p, rounded as NumPy's (float16) and ml_dtypes' (bfloat16) casts round. */
#define VMEM_NCHW_TO_NHWC(name, T, conv)                                                                     \
    VMEM_KERNEL void name(VMEM_TID2_ARG const float* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t c, \
                          int64_t hw) {                                                                      \
        int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);                                                           \
        if (r >= rows) return;                                                                               \
        int64_t b = vmem_div(r, hw), p = r - b * hw;                                                         \
        y[r * c + ch] = conv(x[(b * c + ch) * hw + p]);                                                      \
    }
#define VMEM_SAME(v) (v)
VMEM_NCHW_TO_NHWC(nchw_to_nhwc_f32, float, VMEM_SAME)
VMEM_NCHW_TO_NHWC(nchw_to_nhwc_f16, uint16_t, vmem_f2h)
VMEM_NCHW_TO_NHWC(nchw_to_nhwc_bf16, uint16_t, vmem_f2bf)

/* Column sums in FP32 of a channels-last map (rows = N * H * W pixels by c channels), in two launches so that
 * the order of the additions is fixed (the same bytes on both devices, no atomics): column_partial sums rows
 * [g * per, min((g + 1) * per, rows)) of each column, in row order, into partial[g * c + ch] (a grid of
 * groups x c threads: neighbouring threads read neighbouring channels); column_finish sums the groups' partial
 * sums of a column in order. What a convolution's bias gradient is where cuDNN's BackwardBias does not take
 * the map's type (bfloat16). */
#define VMEM_COLUMN_PARTIAL(NAME, T, LOAD)                                                                   \
    VMEM_KERNEL void NAME(VMEM_TID2_ARG const T* __restrict__ x, float* __restrict__ partial, int64_t rows,   \
                          int64_t c, int64_t per) {                                                          \
        int64_t g = VMEM_ROW(c), ch = VMEM_COL(c), r = g * per, end = r + per < rows ? r + per : rows;        \
        if (r >= rows) return;                                                                               \
        float s = LOAD(x[r * c + ch]);                                                                       \
        for (++r; r < end; ++r) s = VMEM_FADD(s, LOAD(x[r * c + ch]));                                       \
        partial[g * c + ch] = s;                                                                             \
    }
__device__ float vmem_load_f32(float v) { return v; }
VMEM_COLUMN_PARTIAL(column_partial_f32, float, vmem_load_f32)
VMEM_COLUMN_PARTIAL(column_partial_f16, uint16_t, vmem_h2f)
VMEM_COLUMN_PARTIAL(column_partial_bf16, uint16_t, vmem_bf2f)
VMEM_KERNEL void column_finish(VMEM_TID_ARG const float* __restrict__ partial, float* __restrict__ out,
                               int64_t groups, int64_t c) {
    int64_t ch = VMEM_TID;
    if (ch >= c) return;
    float s = partial[ch];
    for (int64_t g = 1; g < groups; ++g) s = VMEM_FADD(s, partial[g * c + ch]);
    out[ch] = s;
}

/* The bias alone, in place: y = y + b[channel] over a channels-last map, rounded once to y's type (as NumPy's
 * y += b with an FP32 b computes in FP32 and casts back). */
VMEM_KERNEL void bias_add_f32(VMEM_TID2_ARG float* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = VMEM_FADD(y[r * c + ch], b[ch]);
}
VMEM_KERNEL void bias_add_f16(VMEM_TID2_ARG uint16_t* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = vmem_f2h(VMEM_FADD(vmem_h2f(y[r * c + ch]), b[ch]));
}
VMEM_KERNEL void bias_add_bf16(VMEM_TID2_ARG uint16_t* y, const float* __restrict__ b, int64_t rows, int64_t c) {
    int64_t r = VMEM_ROW(c), ch = VMEM_COL(c);
    if (r >= rows) return;
    y[r * c + ch] = vmem_f2bf(VMEM_FADD(vmem_bf2f(y[r * c + ch]), b[ch]));
}

/* The step's finite flag over many float32 tensors in one launch (the weight gradients, the running
 * statistics), as PyTorch's multi-tensor kernels: thread t reads value t of their concatenation (``offsets``:
 * each tensor's first index in it, the total last; ``ptrs``: their addresses) and clears ok[0] where that
 * value is an infinity or a NaN. Clearing is the only write: threads that race write the same byte. */
VMEM_KERNEL void finite_multi(VMEM_TID_ARG const uint64_t* ptrs, const int64_t* offsets, int64_t tensors,
                              uint8_t* ok) {
    int64_t t = VMEM_TID, lo = 0, hi = tensors;
    if (t >= offsets[tensors]) return;
    while (hi - lo > 1) { /* the tensor holding t: offsets[lo] <= t < offsets[lo + 1] (no division) */
        int64_t mid = (lo + hi) >> 1;
        if (offsets[mid] <= t) lo = mid;
        else hi = mid;
    }
    const uint32_t* x = (const uint32_t*)(size_t)ptrs[lo];
    if ((x[t - offsets[lo]] & 0x7f800000u) == 0x7f800000u) ok[0] = 0;
}

/* ReLU, y = max(x, 0); y may be x (in place). One value of each kind first (shared by the kernels that
 * take one value a thread and those that take four), then the kernels. */
__device__ uint16_t vmem_relu_one_f16(uint16_t h) {  /* a half is kept as it is or made +0: no rounding */
    return (vmem_h2f(h) > 0.0f || (h & 0x7fffu) > 0x7c00u) ? h : (uint16_t)0;
}
__device__ uint16_t vmem_relu_one_bf16(uint16_t h) {
    return (vmem_bf2f(h) > 0.0f || (h & 0x7fffu) > 0x7f80u) ? h : (uint16_t)0;
}
__device__ float vmem_relu_grad_f32(float y, float dy) { return VMEM_FMUL(dy, (float)(y > 0.0f)); }
__device__ uint16_t vmem_relu_grad_f16(uint16_t y, uint16_t dy) {
    return vmem_f2h(VMEM_FMUL(vmem_h2f(dy), (float)(vmem_h2f(y) > 0.0f)));
}
__device__ uint16_t vmem_relu_grad_bf16(uint16_t y, uint16_t dy) {
    return vmem_f2bf(VMEM_FMUL(vmem_bf2f(dy), (float)(vmem_bf2f(y) > 0.0f)));
}

VMEM_KERNEL void relu_f32(VMEM_TID_ARG const float* x, float* y, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) y[j] = vmem_relu(x[j]);
}
VMEM_KERNEL void relu_f16(VMEM_TID_ARG const uint16_t* x, uint16_t* y, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) y[j] = vmem_relu_one_f16(x[j]);
}
VMEM_KERNEL void relu_bf16(VMEM_TID_ARG const uint16_t* x, uint16_t* y, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) y[j] = vmem_relu_one_bf16(x[j]);
}

/* Gist's binarize of a 16-bit map, read as it is stored (no FP32 copy): bit i of byte b is x[8b + i] > 0, as
 * binarize_encode makes it of the same values widened (NaN is not > 0). */
#define VMEM_BINARIZE16(name, from)                                                                         \
    VMEM_KERNEL void name(VMEM_TID_ARG const uint16_t* __restrict__ x, uint8_t* __restrict__ bits, int64_t n) { \
        int64_t b = VMEM_TID;                                                                                \
        if (b * 8 >= n) return;                                                                              \
        uint32_t byte = 0;                                                                                   \
        for (int64_t j = b * 8; j < n && j < b * 8 + 8; ++j) byte |= (uint32_t)(from(x[j]) > 0.0f) << (j - b * 8); \
        bits[b] = (uint8_t)byte;                                                                             \
    }
VMEM_BINARIZE16(binarize_encode_f16, vmem_h2f)
VMEM_BINARIZE16(binarize_encode_bf16, vmem_bf2f)

/* ReLU's backward on the bits of its output (Gist's binarize) in 16-bit floats, in place on the gradient (dx
 * may be dy): the product as the FP32 kernel makes it, rounded once (exact: dy or a signed zero). */
#define VMEM_BITS_GRAD16(name, to, from)                                                                  \
    VMEM_KERNEL void name(VMEM_TID_ARG const uint8_t* __restrict__ bits, const uint16_t* dy, uint16_t* dx, \
                          int64_t n) {                                                                     \
        int64_t j = VMEM_TID;                                                                              \
        if (j < n) dx[j] = to(VMEM_FMUL(from(dy[j]), (float)((bits[j >> 3] >> (j & 7)) & 1u)));           \
    }
VMEM_BITS_GRAD16(binarize_relu_backward_f16, vmem_f2h, vmem_h2f)
VMEM_BITS_GRAD16(binarize_relu_backward_bf16, vmem_f2bf, vmem_bf2f)

/* ReLU's backward from its output, in place on the gradient (dx may be dy): dx = dy * (y > 0). */
VMEM_KERNEL void relu_backward_f32(VMEM_TID_ARG const float* y, const float* dy, float* dx, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) dx[j] = vmem_relu_grad_f32(y[j], dy[j]);
}
VMEM_KERNEL void relu_backward_f16(VMEM_TID_ARG const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) dx[j] = vmem_relu_grad_f16(y[j], dy[j]);
}
VMEM_KERNEL void relu_backward_bf16(VMEM_TID_ARG const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n) {
    int64_t j = VMEM_TID;
    if (j < n) dx[j] = vmem_relu_grad_bf16(y[j], dy[j]);
}

/* The same, four values a thread (16 bytes of float32, 8 of half in one load on the GPU), over the
 * ``groups`` whole groups of four of arrays whose pointers are aligned to that (the caller checks, and runs
 * the rest with the kernels above): the same arithmetic a value. */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define VMEM_RELU4_F32(g, x, y)                                                                    \
    do {                                                                                           \
        float4 v = ((const float4*)(x))[g];                                                        \
        v.x = vmem_relu(v.x); v.y = vmem_relu(v.y); v.z = vmem_relu(v.z); v.w = vmem_relu(v.w);    \
        ((float4*)(y))[g] = v;                                                                     \
    } while (0)
#define VMEM_GRAD4_F32(g, y, dy, dx)                                                               \
    do {                                                                                           \
        float4 a = ((const float4*)(y))[g], d = ((const float4*)(dy))[g];                          \
        d.x = vmem_relu_grad_f32(a.x, d.x); d.y = vmem_relu_grad_f32(a.y, d.y);                    \
        d.z = vmem_relu_grad_f32(a.z, d.z); d.w = vmem_relu_grad_f32(a.w, d.w);                    \
        ((float4*)(dx))[g] = d;                                                                    \
    } while (0)
/* four halves in a uint2: the low half of each word first (little endian) */
#define VMEM_LO(w) ((uint16_t)((w) & 0xffffu))
#define VMEM_HI(w) ((uint16_t)((w) >> 16))
#define VMEM_PAIR(lo, hi) ((uint32_t)(lo) | ((uint32_t)(hi) << 16))
#define VMEM_RELU4_16(F, g, x, y)                                                                  \
    do {                                                                                           \
        uint2 v = ((const uint2*)(x))[g];                                                          \
        v.x = VMEM_PAIR(F(VMEM_LO(v.x)), F(VMEM_HI(v.x)));                                         \
        v.y = VMEM_PAIR(F(VMEM_LO(v.y)), F(VMEM_HI(v.y)));                                         \
        ((uint2*)(y))[g] = v;                                                                      \
    } while (0)
#define VMEM_GRAD4_16(F, g, y, dy, dx)                                                             \
    do {                                                                                           \
        uint2 a = ((const uint2*)(y))[g], d = ((const uint2*)(dy))[g];                             \
        d.x = VMEM_PAIR(F(VMEM_LO(a.x), VMEM_LO(d.x)), F(VMEM_HI(a.x), VMEM_HI(d.x)));             \
        d.y = VMEM_PAIR(F(VMEM_LO(a.y), VMEM_LO(d.y)), F(VMEM_HI(a.y), VMEM_HI(d.y)));             \
        ((uint2*)(dx))[g] = d;                                                                     \
    } while (0)
#else
#define VMEM_RELU4_F32(g, x, y) for (int i = 0; i < 4; ++i) (y)[4 * (g) + i] = vmem_relu((x)[4 * (g) + i])
#define VMEM_GRAD4_F32(g, y, dy, dx) \
    for (int i = 0; i < 4; ++i) (dx)[4 * (g) + i] = vmem_relu_grad_f32((y)[4 * (g) + i], (dy)[4 * (g) + i])
#define VMEM_RELU4_16(F, g, x, y) for (int i = 0; i < 4; ++i) (y)[4 * (g) + i] = F((x)[4 * (g) + i])
#define VMEM_GRAD4_16(F, g, y, dy, dx) \
    for (int i = 0; i < 4; ++i) (dx)[4 * (g) + i] = F((y)[4 * (g) + i], (dy)[4 * (g) + i])
#endif
VMEM_KERNEL void relu4_f32(VMEM_TID_ARG const float* x, float* y, int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_RELU4_F32(g, x, y);
}
VMEM_KERNEL void relu4_f16(VMEM_TID_ARG const uint16_t* x, uint16_t* y, int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_RELU4_16(vmem_relu_one_f16, g, x, y);
}
VMEM_KERNEL void relu4_bf16(VMEM_TID_ARG const uint16_t* x, uint16_t* y, int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_RELU4_16(vmem_relu_one_bf16, g, x, y);
}
VMEM_KERNEL void relu_backward4_f32(VMEM_TID_ARG const float* y, const float* dy, float* dx, int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_GRAD4_F32(g, y, dy, dx);
}
VMEM_KERNEL void relu_backward4_f16(VMEM_TID_ARG const uint16_t* y, const uint16_t* dy, uint16_t* dx,
                                    int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_GRAD4_16(vmem_relu_grad_f16, g, y, dy, dx);
}
VMEM_KERNEL void relu_backward4_bf16(VMEM_TID_ARG const uint16_t* y, const uint16_t* dy, uint16_t* dx,
                                     int64_t groups) {
    int64_t g = VMEM_TID;
    if (g < groups) VMEM_GRAD4_16(vmem_relu_grad_bf16, g, y, dy, dx);
}

/* Max pooling over channels-last maps without padding, windows kh x kw at stride sh x sw, every window inside
 * the input: the maximum and its window position (row-major, the first of equal maxima; a NaN is the maximum,
 * as in NumPy's argmax) written in one pass. With `packed` the positions are 4 bits each, two outputs to a byte
 * in the output's memory order (the even one in the low nibble, as vmem's MaxPool2d keeps them for windows of
 * up to 16 positions): one thread per byte. Else one byte and one thread per output. The backward runs one
 * thread per input value, for windows that do not overlap (stride at least the window): dx is dy where the
 * value was its window's maximum, else +0, written in one pass (no zeroing launch, no atomics). */
/* The index arithmetic runs in 32 bits where the map's elements number fewer than 2^31 (a 64-bit division is
 * a long software sequence on the GPU: the backward was ALU-bound), else in 64; one helper per index type. */
/* q = a / b, r = a % b in index type I: 32-bit operators, or vmem_div64 for 64-bit indices */
#define VMEM_DIVMOD_int32_t(q, r, a, b) do { int32_t vmem_a = (a); q = vmem_a / (b); r = vmem_a - q * (b); } while (0)
#define VMEM_DIVMOD_int64_t(q, r, a, b)                                                                      \
    do { int64_t vmem_a = (a); q = vmem_div64(vmem_a, (b)); r = vmem_a - q * (b); } while (0)
#define VMEM_DIVMOD(I, q, r, a, b) VMEM_DIVMOD_##I(q, r, a, b)
#define VMEM_MAXPOOL_FWD_ONE(NAME, T, LOAD, I)                                                               \
    __device__ int NAME(const T* __restrict__ x, T* __restrict__ y, I o, I h, I w, I c, I ho, I wo, int kh,    \
                        int kw, int sh, int sw) {                                                            \
        I ch, q, ow, oh, img;                                                                                \
        VMEM_DIVMOD(I, q, ch, o, c);                                                                         \
        VMEM_DIVMOD(I, q, ow, q, wo);                                                                        \
        VMEM_DIVMOD(I, img, oh, q, ho);                                                                      \
        const T* base = x + ((img * h + oh * sh) * w + ow * sw) * c + ch;                                    \
        T best = base[0];                                                                                    \
        float bv = LOAD(best);                                                                               \
        int at = 0;                                                                                          \
        for (int i = 0; i < kh; ++i)                                                                         \
            for (int j = 0; j < kw; ++j) {                                                                   \
                T t = base[(i * w + j) * c];                                                                 \
                float v = LOAD(t);                                                                           \
                if (v > bv || (v != v && bv == bv)) { best = t; bv = v; at = i * kw + j; }                   \
            }                                                                                                \
        y[o] = best;                                                                                         \
        return at;                                                                                           \
    }
#define VMEM_MAXPOOL_FWD(NAME, T, LOAD)                                                                      \
    VMEM_MAXPOOL_FWD_ONE(NAME##_one, T, LOAD, int64_t)                                                       \
    VMEM_MAXPOOL_FWD_ONE(NAME##_one32, T, LOAD, int32_t)                                                     \
    VMEM_KERNEL void NAME(VMEM_TID_ARG const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ arg, \
                          int64_t n, int64_t h, int64_t w, int64_t c, int64_t ho, int64_t wo, int kh, int kw,  \
                          int sh, int sw, int packed) {                                                      \
        int64_t t = VMEM_TID, total = n * ho * wo * c;                                                       \
        int small = n * h * w * c < 2147483647LL;                                                            \
        if (!packed) {                                                                                       \
            if (t >= total) return;                                                                          \
            arg[t] = (uint8_t)(small ? NAME##_one32(x, y, (int32_t)t, (int32_t)h, (int32_t)w, (int32_t)c,    \
                                                    (int32_t)ho, (int32_t)wo, kh, kw, sh, sw)                \
                                     : NAME##_one(x, y, t, h, w, c, ho, wo, kh, kw, sh, sw));                \
            return;                                                                                          \
        }                                                                                                    \
        if (2 * t >= total) return;                                                                          \
        int lo, hi = 0;                                                                                      \
        if (small) {                                                                                         \
            lo = NAME##_one32(x, y, (int32_t)(2 * t), (int32_t)h, (int32_t)w, (int32_t)c, (int32_t)ho,       \
                              (int32_t)wo, kh, kw, sh, sw);                                                  \
            if (2 * t + 1 < total)                                                                           \
                hi = NAME##_one32(x, y, (int32_t)(2 * t + 1), (int32_t)h, (int32_t)w, (int32_t)c, (int32_t)ho, \
                                  (int32_t)wo, kh, kw, sh, sw);                                              \
        } else {                                                                                             \
            lo = NAME##_one(x, y, 2 * t, h, w, c, ho, wo, kh, kw, sh, sw);                                   \
            if (2 * t + 1 < total) hi = NAME##_one(x, y, 2 * t + 1, h, w, c, ho, wo, kh, kw, sh, sw);        \
        }                                                                                                    \
        arg[t] = (uint8_t)(lo | (hi << 4));                                                                  \
    }
#define VMEM_MAXPOOL_BWD_ONE(NAME, T, ZERO, I)                                                               \
    __device__ T NAME(const T* __restrict__ dy, const uint8_t* __restrict__ arg, I j, I h, I w, I c, I ho,     \
                      I wo, int kh, int kw, int sh, int sw, int packed) {                                    \
        I ch, q, col, row, img, oh, ow, di, dj;                                                              \
        VMEM_DIVMOD(I, q, ch, j, c);                                                                         \
        VMEM_DIVMOD(I, q, col, q, w);                                                                        \
        VMEM_DIVMOD(I, img, row, q, h);                                                                      \
        VMEM_DIVMOD(I, oh, di, row, (I)sh);                                                                  \
        VMEM_DIVMOD(I, ow, dj, col, (I)sw);                                                                  \
        if (oh < ho && ow < wo && di < kh && dj < kw) {                                                      \
            I o = ((img * ho + oh) * wo + ow) * c + ch;                                                      \
            int at = packed ? (arg[o >> 1] >> ((o & 1) << 2)) & 15 : arg[o];                                 \
            if (at == di * kw + dj) return dy[o];                                                            \
        }                                                                                                    \
        return ZERO;                                                                                         \
    }
#define VMEM_MAXPOOL_BWD(NAME, T, ZERO)                                                                      \
    VMEM_MAXPOOL_BWD_ONE(NAME##_one, T, ZERO, int64_t)                                                       \
    VMEM_MAXPOOL_BWD_ONE(NAME##_one32, T, ZERO, int32_t)                                                     \
    VMEM_KERNEL void NAME(VMEM_TID_ARG const T* __restrict__ dy, const uint8_t* __restrict__ arg,            \
                          T* __restrict__ dx, int64_t n, int64_t h, int64_t w, int64_t c, int64_t ho,          \
                          int64_t wo, int kh, int kw, int sh, int sw, int packed) {                          \
        int64_t j = VMEM_TID, total = n * h * w * c;                                                         \
        if (j >= total) return;                                                                              \
        dx[j] = total < 2147483647LL ? NAME##_one32(dy, arg, (int32_t)j, (int32_t)h, (int32_t)w, (int32_t)c, \
                                                    (int32_t)ho, (int32_t)wo, kh, kw, sh, sw, packed)        \
                                     : NAME##_one(dy, arg, j, h, w, c, ho, wo, kh, kw, sh, sw, packed);      \
    }
VMEM_MAXPOOL_FWD(maxpool_forward_f32, float, vmem_load_f32)
VMEM_MAXPOOL_FWD(maxpool_forward_f16, uint16_t, vmem_h2f)
VMEM_MAXPOOL_FWD(maxpool_forward_bf16, uint16_t, vmem_bf2f)
VMEM_MAXPOOL_BWD(maxpool_backward_f32, float, 0.0f)
VMEM_MAXPOOL_BWD(maxpool_backward_16, uint16_t, (uint16_t)0)

/* The same backward with ReLU's fused after it, where a ReLU's output is the pool's only input and its
 * gradient is the pool's input gradient (an in-place ReLU): dx = (pool's dx) * (x > 0), x the ReLU's output,
 * rounded as ReLU's own backward kernel rounds it (vmem_relu_grad_*), so that one pass writes what the two
 * passes wrote. */
#define VMEM_MAXPOOL_RELU_BWD(NAME, T, BWD, GRAD)                                                            \
    VMEM_KERNEL void NAME(VMEM_TID_ARG const T* __restrict__ dy, const uint8_t* __restrict__ arg,            \
                          const T* __restrict__ x, T* __restrict__ dx, int64_t n, int64_t h, int64_t w,        \
                          int64_t c, int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed) {     \
        int64_t j = VMEM_TID, total = n * h * w * c;                                                         \
        if (j >= total) return;                                                                              \
        T g = total < 2147483647LL ? BWD##_one32(dy, arg, (int32_t)j, (int32_t)h, (int32_t)w, (int32_t)c,     \
                                                 (int32_t)ho, (int32_t)wo, kh, kw, sh, sw, packed)           \
                                  : BWD##_one(dy, arg, j, h, w, c, ho, wo, kh, kw, sh, sw, packed);          \
        dx[j] = GRAD(x[j], g);                                                                               \
    }
VMEM_MAXPOOL_RELU_BWD(maxpool_relu_backward_f32, float, maxpool_backward_f32, vmem_relu_grad_f32)
VMEM_MAXPOOL_RELU_BWD(maxpool_relu_backward_f16, uint16_t, maxpool_backward_16, vmem_relu_grad_f16)
VMEM_MAXPOOL_RELU_BWD(maxpool_relu_backward_bf16, uint16_t, maxpool_backward_16, vmem_relu_grad_bf16)


/* ==== The optimizer's update, fused: one pass over a parameter, its gradient and its state ================
 * Each product and sum rounded as the NumPy update of vmem.optim rounds it (the scalars given in FP32, as
 * NumPy casts Python floats beside float32 arrays), so the weights are the same bytes. ``ok`` is the step's
 * device flag (nonzero: the loss and every gradient are finite): where it is 0 nothing is written, and the
 * host never had to read it to decide. The gradient is written where the NumPy update writes it (weight
 * decay, Nesterov), as later steps may read it. The scalars are read from device memory ``s`` (copied there
 * in the step, in stream order), not passed by value: a step replayed as a CUDA graph takes this step's
 * learning rate and bias correction, not those of the step it was captured in. */
VMEM_KERNEL void sgd_update(VMEM_TID_ARG float* __restrict__ p, float* __restrict__ g, float* __restrict__ buf,
                            const uint8_t* __restrict__ ok, int64_t n, const float* __restrict__ s) {
    int64_t j = VMEM_TID;
    if (j >= n || !ok[0]) return;
    /* s: lr, momentum, weight decay, nesterov (0 or 1), first step (0 or 1) */
    float lr = s[0], momentum = s[1], decay = s[2];
    int nesterov = s[3] != 0.0f, first = s[4] != 0.0f;
    float gj = g[j];
    if (decay != 0.0f) g[j] = gj = VMEM_FADD(gj, VMEM_FMUL(decay, p[j]));
    if (momentum != 0.0f) {
        float b = first ? gj : VMEM_FADD(VMEM_FMUL(momentum, buf[j]), gj);
        buf[j] = b;
        if (nesterov) g[j] = gj = VMEM_FADD(gj, VMEM_FMUL(momentum, b));
        else gj = b;
    }
    p[j] = VMEM_FADD(p[j], -VMEM_FMUL(lr, gj));
}

VMEM_KERNEL void adam_update(VMEM_TID_ARG float* __restrict__ p, float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, const uint8_t* __restrict__ ok, int64_t n,
                             const float* __restrict__ s) {
    int64_t j = VMEM_TID;
    if (j >= n || !ok[0]) return;
    /* s: step size (lr over 1 - b1^t), b1, 1 - b1, b2, 1 - b2, 1 - b2^t, eps, weight decay */
    float step_size = s[0], b1 = s[1], c1 = s[2], b2 = s[3], c2 = s[4], bias2 = s[5], eps = s[6], decay = s[7];
    float gj = g[j];
    if (decay != 0.0f) g[j] = gj = VMEM_FADD(gj, VMEM_FMUL(decay, p[j]));
    float mj = VMEM_FADD(VMEM_FMUL(b1, m[j]), VMEM_FMUL(c1, gj));
    float vj = VMEM_FADD(VMEM_FMUL(b2, v[j]), VMEM_FMUL(VMEM_FMUL(c2, gj), gj));
    m[j] = mj;
    v[j] = vj;
    float denom = VMEM_FADD(VMEM_FSQRT(VMEM_FDIV(vj, bias2)), eps);
    p[j] = VMEM_FADD(p[j], -VMEM_FMUL(step_size, VMEM_FDIV(mj, denom)));
}
