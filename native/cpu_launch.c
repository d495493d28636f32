/* Serial launchers: run each kernel of kernels.cuh over a 1-D grid on the CPU (see shim.h). */
#include "kernels.cuh"

#define THREADS 256
#define BLOCKS(n) ((unsigned)(((n) + THREADS - 1) / THREADS))

void vmem_binarize_encode(const float* x, uint8_t* bits, int64_t n) {
    VMEM_LAUNCH(BLOCKS((n + 7) / 8), THREADS, binarize_encode, x, bits, n);
}
void vmem_binarize_decode(const uint8_t* bits, float* out, int64_t n) {
    VMEM_LAUNCH(BLOCKS(n), THREADS, binarize_decode, bits, out, n);
}
void vmem_zvc_mask(const uint32_t* x, uint32_t* mask, uint32_t* count, int64_t n) {
    VMEM_LAUNCH(BLOCKS((n + 31) / 32), THREADS, zvc_mask, x, mask, count, n);
}
void vmem_zvc_pack(const uint32_t* x, const uint32_t* mask, const int64_t* offset, uint32_t* values, int64_t n) {
    VMEM_LAUNCH(BLOCKS((n + 31) / 32), THREADS, zvc_pack, x, mask, offset, values, n);
}
void vmem_zvc_unpack(const uint32_t* mask, const int64_t* offset, const uint32_t* values, uint32_t* out, int64_t n) {
    VMEM_LAUNCH(BLOCKS((n + 31) / 32), THREADS, zvc_unpack, mask, offset, values, out, n);
}
void vmem_dpr_encode(const uint32_t* x, uint16_t* codes, int64_t n, int ebits, int mbits) {
    VMEM_LAUNCH(BLOCKS(n), THREADS, dpr_encode, x, codes, n, ebits, mbits);
}
void vmem_dpr_decode(const uint16_t* codes, uint32_t* out, int64_t n, int ebits, int mbits) {
    VMEM_LAUNCH(BLOCKS(n), THREADS, dpr_decode, codes, out, n, ebits, mbits);
}
