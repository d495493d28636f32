"""cffi builder for the CPU build of native/kernels.cuh (module ``vmem._native``)."""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef("""
void vmem_binarize_encode(const float* x, uint8_t* bits, int64_t n);
void vmem_binarize_decode(const uint8_t* bits, float* out, int64_t n);
void vmem_zvc_mask(const uint32_t* x, uint32_t* mask, uint32_t* count, int64_t n);
void vmem_zvc_pack(const uint32_t* x, const uint32_t* mask, const int64_t* offset, uint32_t* values, int64_t n);
void vmem_zvc_unpack(const uint32_t* mask, const int64_t* offset, const uint32_t* values, uint32_t* out, int64_t n);
void vmem_dpr_encode(const uint32_t* x, uint16_t* codes, int64_t n, int ebits, int mbits);
void vmem_dpr_decode(const uint16_t* codes, uint32_t* out, int64_t n, int ebits, int mbits);
""")
ffibuilder.set_source("vmem._native", '#include "cpu_launch.c"', include_dirs=[str(HERE)],
                      extra_compile_args=["-O3", "-std=c99"], depends=[str(HERE / n) for n in
                                                                     ("shim.h", "kernels.cuh", "cpu_launch.c")])

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parent / "build" / "native"), verbose=True)
