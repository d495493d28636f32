/* cffi declarations of vmem/csrc/winograd.c (read by build_cpu.py). */
void vmem_wg_input(int64_t t0, int64_t t1, const float* x, float* v, int64_t ps, int64_t h, int64_t w, int64_t c,
                   int64_t th, int64_t tw, int64_t ph, int64_t pw);
void vmem_wg_output(int64_t t0, int64_t t1, const float* m, const float* bias, float* y, int64_t ps, int64_t h,
                    int64_t w, int64_t k, int64_t th, int64_t tw);
void vmem_wg_output_adjoint(int64_t t0, int64_t t1, const float* dy, float* m, int64_t ps, int64_t h, int64_t w,
                            int64_t k, int64_t th, int64_t tw);
void vmem_wg_filter(int64_t k0, int64_t k1, const float* w, float* u, int64_t ps, int64_t k, int64_t c, int flip);
void vmem_wg_filter_grad(int64_t k0, int64_t k1, const float* du, float* dw, int64_t ps, int64_t k, int64_t c);
