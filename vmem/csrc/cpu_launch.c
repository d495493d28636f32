/* CPU launchers: each runs one kernel of kernels.cuh over threads [t0, t1) of its 1-D grid (see shim.h).
 * Python splits a grid into one range per core (cffi releases the GIL during the call). */
#include "kernels.cuh"

/* On x86-64 Linux, GCC and Clang compile each launcher twice, for AVX2 and for the baseline, and pick one
 * when the module loads (function multi-versioning): fast where the CPU has AVX2, correct everywhere. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(VMEM_NO_CLONES)
#define VMEM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VMEM_CLONES
#endif

#define LAUNCHER(name, params, ...) \
    VMEM_CLONES void vmem_##name(int64_t t0, int64_t t1, params) { VMEM_LAUNCH(t0, t1, name, __VA_ARGS__); }
/* A 2-D kernel's launcher takes its range of rows; cols is an expression of its parameters. */
#define LAUNCHER2(name, cols, params, ...) \
    VMEM_CLONES void vmem_##name(int64_t t0, int64_t t1, params) { VMEM_LAUNCH2(t0, t1, cols, name, __VA_ARGS__); }
/* The same, running name##_whole instead for the rows where ``whole`` (an expression of vmem_row and the
 * parameters) holds: a kernel without edge cases, whose loop over columns vectorizes. */
#define LAUNCHER2_WHOLE(name, cols, whole, params, ...)                                    \
    VMEM_CLONES void vmem_##name(int64_t t0, int64_t t1, params) {                         \
        for (int64_t vmem_row = t0; vmem_row < t1; ++vmem_row) {                           \
            if (whole) VMEM_LAUNCH2(vmem_row, vmem_row + 1, cols, name##_whole, __VA_ARGS__); \
            else VMEM_LAUNCH2(vmem_row, vmem_row + 1, cols, name, __VA_ARGS__);            \
        }                                                                                  \
    }
#define P(...) __VA_ARGS__

LAUNCHER(binarize_encode, P(const float* x, uint8_t* bits, int64_t n), x, bits, n)
LAUNCHER(binarize_decode, P(const uint8_t* bits, float* out, int64_t n), bits, out, n)
LAUNCHER(binarize_relu_backward, P(const uint8_t* bits, const float* dy, float* dx, int64_t n), bits, dy, dx, n)
LAUNCHER(zvc_mask, P(const uint32_t* x, uint32_t* mask, uint32_t* count, int64_t n), x, mask, count, n)
LAUNCHER(zvc_count, P(const uint32_t* mask, uint32_t* count, int64_t groups), mask, count, groups)
LAUNCHER(zvc_pack, P(const uint32_t* x, const uint32_t* mask, const int64_t* offset, uint32_t* values, int64_t n),
         x, mask, offset, values, n)
LAUNCHER(zvc_unpack, P(const uint32_t* mask, const int64_t* offset, const uint32_t* values, uint32_t* out, int64_t n),
         mask, offset, values, out, n)
LAUNCHER(ssdc_count, P(const uint32_t* x, int32_t* count, int64_t n), x, count, n)
LAUNCHER(ssdc_pack, P(const uint32_t* x, const int32_t* row_ptr, uint8_t* cols, uint32_t* values, int64_t n),
         x, row_ptr, cols, values, n)
LAUNCHER(ssdc_unpack, P(const int32_t* row_ptr, const uint8_t* cols, const uint32_t* values, uint32_t* out, int64_t n),
         row_ptr, cols, values, out, n)
LAUNCHER(dpr16_encode, P(const uint32_t* x, uint16_t* codes, int64_t n), x, codes, n)
LAUNCHER(dpr16_decode, P(const uint16_t* codes, uint32_t* out, int64_t n), codes, out, n)
LAUNCHER(dpr8_encode, P(const uint32_t* x, uint8_t* codes, int64_t n), x, codes, n)
LAUNCHER(dpr8_decode, P(const uint8_t* codes, uint32_t* out, int64_t n), codes, out, n)
LAUNCHER(dpr10_encode, P(const uint32_t* x, uint32_t* words, int64_t n), x, words, n)
LAUNCHER(dpr10_encode_full, P(const uint32_t* x, uint32_t* words, int64_t n), x, words, n)
LAUNCHER(dpr10_decode, P(const uint32_t* words, uint32_t* out, int64_t n), words, out, n)
LAUNCHER(dpr10_decode_full, P(const uint32_t* words, uint32_t* out, int64_t n), words, out, n)
LAUNCHER(fixed_encode, P(const float* x, const float* lo, const float* scale, uint8_t* codes, int64_t n,
                         int64_t inner, int64_t channels, int bits), x, lo, scale, codes, n, inner, channels, bits)
LAUNCHER(fixed_decode, P(const uint8_t* codes, const float* lo, const float* scale, float* out, int64_t n,
                         int64_t inner, int64_t channels, int bits), codes, lo, scale, out, n, inner, channels, bits)
/* restrict: the arrays do not overlap, across the whole launch (a kernel's own restrict covers one thread) */
LAUNCHER2(fixed8_encode_rows, channels, P(const float* restrict x, const float* restrict lo,
          const float* restrict scale, uint8_t* restrict codes, int64_t rows, int64_t channels),
          x, lo, scale, codes, rows, channels)
LAUNCHER2(fixed4_encode_rows, channels / 2, P(const float* restrict x, const float* restrict lo,
          const float* restrict scale, uint8_t* restrict codes, int64_t rows, int64_t channels),
          x, lo, scale, codes, rows, channels)
LAUNCHER2(fixed8_decode_rows, channels, P(const uint8_t* restrict codes, const float* restrict lo,
          const float* restrict scale, float* restrict out, int64_t rows, int64_t channels),
          codes, lo, scale, out, rows, channels)
LAUNCHER2(fixed4_decode_rows, channels / 2, P(const uint8_t* restrict codes, const float* restrict lo,
          const float* restrict scale, float* restrict out, int64_t rows, int64_t channels),
          codes, lo, scale, out, rows, channels)
LAUNCHER2_WHOLE(patch2_encode, c, patch2_whole(vmem_row, h, w),
                P(const float* restrict x, uint32_t* restrict codes, float* restrict lo, float* restrict scale,
                  int64_t n, int64_t h, int64_t w, int64_t c), x, codes, lo, scale, n, h, w, c)
LAUNCHER2(patch2_decode, c, P(const uint32_t* restrict codes, const float* restrict lo, const float* restrict scale,
                              float* restrict x, int64_t n, int64_t h, int64_t w, int64_t c),
          codes, lo, scale, x, n, h, w, c)

/* the layers' kernels (in place: no restrict between the arrays a launch reads and writes) */
LAUNCHER2(bias_relu_f32, c, P(float* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(bias_relu_f16, c, P(uint16_t* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(bias_relu_bf16, c, P(uint16_t* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(nchw_to_nhwc_f32, c, P(const float* x, float* y, int64_t rows, int64_t c, int64_t hw), x, y, rows, c, hw)
LAUNCHER2(nchw_to_nhwc_f16, c, P(const float* x, uint16_t* y, int64_t rows, int64_t c, int64_t hw), x, y, rows, c,
          hw)
LAUNCHER2(nchw_to_nhwc_bf16, c, P(const float* x, uint16_t* y, int64_t rows, int64_t c, int64_t hw), x, y, rows, c,
          hw)
LAUNCHER2(bias_add_f32, c, P(float* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(bias_add_f16, c, P(uint16_t* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(bias_add_bf16, c, P(uint16_t* y, const float* b, int64_t rows, int64_t c), y, b, rows, c)
LAUNCHER2(column_partial_f32, c, P(const float* x, float* partial, int64_t rows, int64_t c, int64_t per),
          x, partial, rows, c, per)
LAUNCHER2(column_partial_f16, c, P(const uint16_t* x, float* partial, int64_t rows, int64_t c, int64_t per),
          x, partial, rows, c, per)
LAUNCHER2(column_partial_bf16, c, P(const uint16_t* x, float* partial, int64_t rows, int64_t c, int64_t per),
          x, partial, rows, c, per)
LAUNCHER(column_finish, P(const float* partial, float* out, int64_t groups, int64_t c), partial, out, groups, c)
LAUNCHER(finite_multi, P(const uint64_t* ptrs, const int64_t* offsets, int64_t tensors, uint8_t* ok),
         ptrs, offsets, tensors, ok)
LAUNCHER(relu4_f32, P(const float* x, float* y, int64_t groups), x, y, groups)
LAUNCHER(relu4_f16, P(const uint16_t* x, uint16_t* y, int64_t groups), x, y, groups)
LAUNCHER(relu4_bf16, P(const uint16_t* x, uint16_t* y, int64_t groups), x, y, groups)
LAUNCHER(relu_backward4_f32, P(const float* y, const float* dy, float* dx, int64_t groups), y, dy, dx, groups)
LAUNCHER(relu_backward4_f16, P(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t groups), y, dy, dx, groups)
LAUNCHER(relu_backward4_bf16, P(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t groups), y, dy, dx, groups)
LAUNCHER(relu_f32, P(const float* x, float* y, int64_t n), x, y, n)
LAUNCHER(relu_f16, P(const uint16_t* x, uint16_t* y, int64_t n), x, y, n)
LAUNCHER(relu_bf16, P(const uint16_t* x, uint16_t* y, int64_t n), x, y, n)
LAUNCHER(relu_backward_f32, P(const float* y, const float* dy, float* dx, int64_t n), y, dy, dx, n)
LAUNCHER(relu_backward_f16, P(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n), y, dy, dx, n)
LAUNCHER(relu_backward_bf16, P(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n), y, dy, dx, n)
LAUNCHER(binarize_encode_f16, P(const uint16_t* x, uint8_t* bits, int64_t n), x, bits, n)
LAUNCHER(binarize_encode_bf16, P(const uint16_t* x, uint8_t* bits, int64_t n), x, bits, n)
LAUNCHER(binarize_relu_backward_f16, P(const uint8_t* bits, const uint16_t* dy, uint16_t* dx, int64_t n),
         bits, dy, dx, n)
LAUNCHER(binarize_relu_backward_bf16, P(const uint8_t* bits, const uint16_t* dy, uint16_t* dx, int64_t n),
         bits, dy, dx, n)
LAUNCHER(maxpool_forward_f32, P(const float* x, float* y, uint8_t* arg, int64_t n, int64_t h, int64_t w, int64_t c,
                                int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed),
         x, y, arg, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_forward_f16, P(const uint16_t* x, uint16_t* y, uint8_t* arg, int64_t n, int64_t h, int64_t w,
                                int64_t c, int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed),
         x, y, arg, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_forward_bf16, P(const uint16_t* x, uint16_t* y, uint8_t* arg, int64_t n, int64_t h, int64_t w,
                                 int64_t c, int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed),
         x, y, arg, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_backward_f32, P(const float* dy, const uint8_t* arg, float* dx, int64_t n, int64_t h, int64_t w,
                                 int64_t c, int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed),
         dy, arg, dx, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_backward_16, P(const uint16_t* dy, const uint8_t* arg, uint16_t* dx, int64_t n, int64_t h,
                                int64_t w, int64_t c, int64_t ho, int64_t wo, int kh, int kw, int sh, int sw, int packed),
         dy, arg, dx, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_relu_backward_f32, P(const float* dy, const uint8_t* arg, const float* x, float* dx, int64_t n,
                                      int64_t h, int64_t w, int64_t c, int64_t ho, int64_t wo, int kh, int kw,
                                      int sh, int sw, int packed),
         dy, arg, x, dx, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_relu_backward_f16, P(const uint16_t* dy, const uint8_t* arg, const uint16_t* x, uint16_t* dx,
                                      int64_t n, int64_t h, int64_t w, int64_t c, int64_t ho, int64_t wo, int kh,
                                      int kw, int sh, int sw, int packed),
         dy, arg, x, dx, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(maxpool_relu_backward_bf16, P(const uint16_t* dy, const uint8_t* arg, const uint16_t* x, uint16_t* dx,
                                       int64_t n, int64_t h, int64_t w, int64_t c, int64_t ho, int64_t wo, int kh,
                                       int kw, int sh, int sw, int packed),
         dy, arg, x, dx, n, h, w, c, ho, wo, kh, kw, sh, sw, packed)
LAUNCHER(sgd_update, P(float* p, float* g, float* buf, const uint8_t* ok, int64_t n, const float* s), p, g, buf, ok,
         n, s)
LAUNCHER(adam_update, P(float* p, float* g, float* m, float* v, const uint8_t* ok, int64_t n, const float* s), p, g,
         m, v, ok, n, s)
