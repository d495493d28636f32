/* Winograd F(2x2, 3x3) transforms of the CPU device's 3x3 stride-1 convolutions (vmem/device/hostconv/winograd.py).
 *
 * CPU only (the CUDA device convolves through cuDNN). Arrays are channels last. A chunk of ``tiles`` tiles
 * is th x tw tiles per image, tile t = (image * th + ti) * tw + tj; its 16 transformed values per channel
 * go to 16 planes ``ps`` floats apart (plane xi holds a tiles x channels matrix), so the products in the
 * transformed domain are 16 plain GEMMs. ``ps`` is padded by the caller so that the planes do not fall
 * 4 KiB apart: 16 write streams that map to one cache set would evict each other on every store.
 * The loops over channels are innermost and vectorize.
 */
#include <stdint.h>

#define WG_BLOCK 64 /* channels per pass over a border tile, whose missing pixels read from a zero block */

static const float wg_zeros[WG_BLOCK];

/* One tile: the 4x4 patch d (16 row pointers, one per pixel, indexed by channel) to B^T d B in 16 planes. */
static inline void wg_input_tile(const float* const* p, float* const* o, int64_t n) {
    const float *restrict p0 = p[0], *restrict p1 = p[1], *restrict p2 = p[2], *restrict p3 = p[3];
    const float *restrict p4 = p[4], *restrict p5 = p[5], *restrict p6 = p[6], *restrict p7 = p[7];
    const float *restrict p8 = p[8], *restrict p9 = p[9], *restrict p10 = p[10], *restrict p11 = p[11];
    const float *restrict p12 = p[12], *restrict p13 = p[13], *restrict p14 = p[14], *restrict p15 = p[15];
    float *restrict o0 = o[0], *restrict o1 = o[1], *restrict o2 = o[2], *restrict o3 = o[3];
    float *restrict o4 = o[4], *restrict o5 = o[5], *restrict o6 = o[6], *restrict o7 = o[7];
    float *restrict o8 = o[8], *restrict o9 = o[9], *restrict o10 = o[10], *restrict o11 = o[11];
    float *restrict o12 = o[12], *restrict o13 = o[13], *restrict o14 = o[14], *restrict o15 = o[15];
    for (int64_t c = 0; c < n; ++c) {
        /* B^T over rows: (d0 - d2, d1 + d2, d2 - d1, d1 - d3) */
        float a0 = p0[c] - p8[c], a1 = p1[c] - p9[c], a2 = p2[c] - p10[c], a3 = p3[c] - p11[c];
        float b0 = p4[c] + p8[c], b1 = p5[c] + p9[c], b2 = p6[c] + p10[c], b3 = p7[c] + p11[c];
        float e0 = p8[c] - p4[c], e1 = p9[c] - p5[c], e2 = p10[c] - p6[c], e3 = p11[c] - p7[c];
        float f0 = p4[c] - p12[c], f1 = p5[c] - p13[c], f2 = p6[c] - p14[c], f3 = p7[c] - p15[c];
        /* ... then over columns */
        o0[c] = a0 - a2; o1[c] = a1 + a2; o2[c] = a2 - a1; o3[c] = a1 - a3;
        o4[c] = b0 - b2; o5[c] = b1 + b2; o6[c] = b2 - b1; o7[c] = b1 - b3;
        o8[c] = e0 - e2; o9[c] = e1 + e2; o10[c] = e2 - e1; o11[c] = e1 - e3;
        o12[c] = f0 - f2; o13[c] = f1 + f2; o14[c] = f2 - f1; o15[c] = f1 - f3;
    }
}

/* Tiles [t0, t1) of x (images of h x w x c, zero-padded by ph rows and pw columns) to V. */
VMEM_CLONES void vmem_wg_input(int64_t t0, int64_t t1, const float* x, float* v, int64_t ps, int64_t h,
                               int64_t w, int64_t c, int64_t th, int64_t tw, int64_t ph, int64_t pw) {
    for (int64_t t = t0; t < t1; ++t) {
        int64_t tj = t % tw, ti = (t / tw) % th, img = t / (tw * th);
        int64_t r0 = 2 * ti - ph, c0 = 2 * tj - pw;
        const float* p[16];
        float* o[16];
        if (r0 >= 0 && c0 >= 0 && r0 + 4 <= h && c0 + 4 <= w) {
            for (int i = 0; i < 16; ++i) {
                p[i] = x + ((img * h + r0 + i / 4) * w + c0 + i % 4) * c;
                o[i] = v + i * ps + t * c;
            }
            wg_input_tile(p, o, c);
            continue;
        }
        for (int64_t lo = 0; lo < c; lo += WG_BLOCK) {
            int64_t n = c - lo < WG_BLOCK ? c - lo : WG_BLOCK;
            for (int i = 0; i < 16; ++i) {
                int64_t r = r0 + i / 4, q = c0 + i % 4;
                p[i] = r >= 0 && r < h && q >= 0 && q < w ? x + ((img * h + r) * w + q) * c + lo : wg_zeros;
                o[i] = v + i * ps + t * c + lo;
            }
            wg_input_tile(p, o, n);
        }
    }
}

/* Tiles [t0, t1) of M (16 planes of tiles x k) to their 2x2 outputs A^T m A in y (images of h x w x k),
 * plus ``bias`` (NULL: none); the last row and column of tiles are cut where h or w is odd. */
VMEM_CLONES void vmem_wg_output(int64_t t0, int64_t t1, const float* m, const float* bias, float* y, int64_t ps,
                                int64_t h, int64_t w, int64_t k, int64_t th, int64_t tw) {
    for (int64_t t = t0; t < t1; ++t) {
        int64_t tj = t % tw, ti = (t / tw) % th, img = t / (tw * th);
        int64_t r0 = 2 * ti, c0 = 2 * tj;
        const float *restrict m0 = m + t * k, *restrict m1 = m0 + ps, *restrict m2 = m0 + 2 * ps;
        const float *restrict m3 = m0 + 3 * ps, *restrict m4 = m0 + 4 * ps, *restrict m5 = m0 + 5 * ps;
        const float *restrict m6 = m0 + 6 * ps, *restrict m7 = m0 + 7 * ps, *restrict m8 = m0 + 8 * ps;
        const float *restrict m9 = m0 + 9 * ps, *restrict m10 = m0 + 10 * ps, *restrict m11 = m0 + 11 * ps;
        const float *restrict m12 = m0 + 12 * ps, *restrict m13 = m0 + 13 * ps, *restrict m14 = m0 + 14 * ps;
        const float *restrict m15 = m0 + 15 * ps;
        int right = c0 + 1 < w, down = r0 + 1 < h;
        float* restrict y00 = y + ((img * h + r0) * w + c0) * k;
        float* restrict y01 = right ? y00 + k : 0;
        float* restrict y10 = down ? y00 + w * k : 0;
        float* restrict y11 = right && down ? y00 + (w + 1) * k : 0;
        for (int64_t c = 0; c < k; ++c) {
            float b = bias ? bias[c] : 0.0f;
            /* A^T over rows: (m0 + m1 + m2, m1 - m2 - m3) */
            float s0 = m0[c] + m4[c] + m8[c], s1 = m1[c] + m5[c] + m9[c];
            float s2 = m2[c] + m6[c] + m10[c], s3 = m3[c] + m7[c] + m11[c];
            float u0 = m4[c] - m8[c] - m12[c], u1 = m5[c] - m9[c] - m13[c];
            float u2 = m6[c] - m10[c] - m14[c], u3 = m7[c] - m11[c] - m15[c];
            y00[c] = s0 + s1 + s2 + b;
            if (y01) y01[c] = s1 - s2 - s3 + b;
            if (y10) y10[c] = u0 + u1 + u2 + b;
            if (y11) y11[c] = u1 - u2 - u3 + b;
        }
    }
}

/* The adjoint of vmem_wg_output (without bias): tiles [t0, t1) of dy (images of h x w x k; outside them,
 * zeros) to A g A^T in 16 planes of M. The gradient of the transformed filters is then V^T M, plane by plane. */
VMEM_CLONES void vmem_wg_output_adjoint(int64_t t0, int64_t t1, const float* dy, float* m, int64_t ps, int64_t h,
                                        int64_t w, int64_t k, int64_t th, int64_t tw) {
    for (int64_t t = t0; t < t1; ++t) {
        int64_t tj = t % tw, ti = (t / tw) % th, img = t / (tw * th);
        int64_t r0 = 2 * ti, c0 = 2 * tj;
        int right = c0 + 1 < w, down = r0 + 1 < h;
        const float* g00 = dy + ((img * h + r0) * w + c0) * k;
        for (int64_t lo = 0; lo < k; lo += WG_BLOCK) {
            int64_t n = k - lo < WG_BLOCK ? k - lo : WG_BLOCK;
            const float *restrict a = g00 + lo, *restrict b = right ? g00 + k + lo : wg_zeros;
            const float *restrict d = down ? g00 + w * k + lo : wg_zeros;
            const float *restrict e = right && down ? g00 + (w + 1) * k + lo : wg_zeros;
            float* restrict o[16];
            for (int i = 0; i < 16; ++i) o[i] = m + i * ps + t * k + lo;
            float *restrict o0 = o[0], *restrict o1 = o[1], *restrict o2 = o[2], *restrict o3 = o[3];
            float *restrict o4 = o[4], *restrict o5 = o[5], *restrict o6 = o[6], *restrict o7 = o[7];
            float *restrict o8 = o[8], *restrict o9 = o[9], *restrict o10 = o[10], *restrict o11 = o[11];
            float *restrict o12 = o[12], *restrict o13 = o[13], *restrict o14 = o[14], *restrict o15 = o[15];
            for (int64_t c = 0; c < n; ++c) {
                /* A over rows of g = [[a, b], [d, e]]: (g0, g0 + g1, g0 - g1, -g1) */
                float r00 = a[c], r01 = b[c];
                float r10 = a[c] + d[c], r11 = b[c] + e[c];
                float r20 = a[c] - d[c], r21 = b[c] - e[c];
                float r30 = -d[c], r31 = -e[c];
                o0[c] = r00; o1[c] = r00 + r01; o2[c] = r00 - r01; o3[c] = -r01;
                o4[c] = r10; o5[c] = r10 + r11; o6[c] = r10 - r11; o7[c] = -r11;
                o8[c] = r20; o9[c] = r20 + r21; o10[c] = r20 - r21; o11[c] = -r21;
                o12[c] = r30; o13[c] = r30 + r31; o14[c] = r30 - r31; o15[c] = -r31;
            }
        }
    }
}

/* Filters [k0, k1) of w (k x 3 x 3 x c; ``flip``: turned by 180 degrees) to G g G^T in 16 planes of k x c,
 * ``ps`` apart. */
VMEM_CLONES void vmem_wg_filter(int64_t k0, int64_t k1, const float* w, float* u, int64_t ps, int64_t k, int64_t c,
                                int flip) {
    for (int64_t f = k0; f < k1; ++f) {
        const float* g[9];
        for (int i = 0; i < 9; ++i) g[i] = w + (f * 9 + (flip ? 8 - i : i)) * c;
        const float *restrict g0 = g[0], *restrict g1 = g[1], *restrict g2 = g[2], *restrict g3 = g[3];
        const float *restrict g4 = g[4], *restrict g5 = g[5], *restrict g6 = g[6], *restrict g7 = g[7];
        const float *restrict g8 = g[8];
        float* restrict o = u + f * c;
        for (int64_t ch = 0; ch < c; ++ch) {
            /* G over rows: (g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2), for each of the 3 columns */
            float r00 = g0[ch], r01 = g1[ch], r02 = g2[ch];
            float r10 = 0.5f * (g0[ch] + g3[ch] + g6[ch]), r11 = 0.5f * (g1[ch] + g4[ch] + g7[ch]);
            float r12 = 0.5f * (g2[ch] + g5[ch] + g8[ch]);
            float r20 = 0.5f * (g0[ch] - g3[ch] + g6[ch]), r21 = 0.5f * (g1[ch] - g4[ch] + g7[ch]);
            float r22 = 0.5f * (g2[ch] - g5[ch] + g8[ch]);
            float r30 = g6[ch], r31 = g7[ch], r32 = g8[ch];
            o[0 * ps + ch] = r00; o[1 * ps + ch] = 0.5f * (r00 + r01 + r02);
            o[2 * ps + ch] = 0.5f * (r00 - r01 + r02); o[3 * ps + ch] = r02;
            o[4 * ps + ch] = r10; o[5 * ps + ch] = 0.5f * (r10 + r11 + r12);
            o[6 * ps + ch] = 0.5f * (r10 - r11 + r12); o[7 * ps + ch] = r12;
            o[8 * ps + ch] = r20; o[9 * ps + ch] = 0.5f * (r20 + r21 + r22);
            o[10 * ps + ch] = 0.5f * (r20 - r21 + r22); o[11 * ps + ch] = r22;
            o[12 * ps + ch] = r30; o[13 * ps + ch] = 0.5f * (r30 + r31 + r32);
            o[14 * ps + ch] = 0.5f * (r30 - r31 + r32); o[15 * ps + ch] = r32;
        }
    }
}

/* Filters [k0, k1) of dw (k x 3 x 3 x c) from the gradient of their transforms (16 planes of k x c, ``ps``
 * apart): G^T dU G. */
VMEM_CLONES void vmem_wg_filter_grad(int64_t k0, int64_t k1, const float* du, float* dw, int64_t ps, int64_t k,
                                     int64_t c) {
    for (int64_t f = k0; f < k1; ++f) {
        const float* restrict d = du + f * c;
        float* restrict o = dw + f * 9 * c;
        for (int64_t ch = 0; ch < c; ++ch) {
            float m[16];
            for (int i = 0; i < 16; ++i) m[i] = d[i * ps + ch];
            /* G^T over rows: (m0 + (m1 + m2) / 2, (m1 - m2) / 2, (m1 + m2) / 2 + m3), for each of the 4 columns */
            float s[3][4];
            for (int b = 0; b < 4; ++b) {
                s[0][b] = m[b] + 0.5f * (m[4 + b] + m[8 + b]);
                s[1][b] = 0.5f * (m[4 + b] - m[8 + b]);
                s[2][b] = 0.5f * (m[4 + b] + m[8 + b]) + m[12 + b];
            }
            for (int i = 0; i < 3; ++i) {
                o[(i * 3 + 0) * c + ch] = s[i][0] + 0.5f * (s[i][1] + s[i][2]);
                o[(i * 3 + 1) * c + ch] = 0.5f * (s[i][1] - s[i][2]);
                o[(i * 3 + 2) * c + ch] = 0.5f * (s[i][1] + s[i][2]) + s[i][3];
            }
        }
    }
}
