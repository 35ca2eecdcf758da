/* lora_ref.c — the reference batched LoRA kernels (kern_lora.h), plain C:
 * the spec and the oracle of lora_avx2.c and lora_avx512.c; and the table
 * that picks one of the three for a vtab. */
#include "kern/kern_int.h"
#include "kern/lora_int.h"

#include <string.h>

void kern__lora_shrink_ref(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                           const float *const *X, float *U, int64_t ldu) {
    for (int j = 0; j < n; j++)
        for (int32_t i = i0; i < i1; i++) {
            const float *a = A + (size_t)i * (size_t)K, *x = X[j];
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += a[k] * x[k];
            U[(size_t)j * (size_t)ldu + (size_t)i] = acc;
        }
}

void kern__lora_expand_ref(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                           const float *U, int64_t ldu, float scale, float *const *Y) {
    for (int j = 0; j < n; j++) {
        const float *u = U + (size_t)j * (size_t)ldu;
        for (int64_t c = c0; c < c1; c++) {
            float acc = 0.0f;
            for (int32_t i = 0; i < r; i++) acc += Bt[(size_t)i * (size_t)N + (size_t)c] * u[i];
            Y[j][c] += scale * acc;
        }
    }
}

void kern__lora_shrink16_ref(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                             const float *const *X, float *U, int64_t ldu) {
    for (int j = 0; j < n; j++)
        for (int32_t i = i0; i < i1; i++) {
            const uint16_t *a = A + (size_t)i * (size_t)K;
            const float *x = X[j];
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += ks_f16_to_f32(a[k]) * x[k];
            U[(size_t)j * (size_t)ldu + (size_t)i] = acc;
        }
}

void kern__lora_expand16_ref(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                             int n, const float *U, int64_t ldu, float scale, float *const *Y) {
    for (int j = 0; j < n; j++) {
        const float *u = U + (size_t)j * (size_t)ldu;
        for (int64_t c = c0; c < c1; c++) {
            float acc = 0.0f;
            for (int32_t i = 0; i < r; i++)
                acc += ks_f16_to_f32(Bt[(size_t)i * (size_t)N + (size_t)c]) * u[i];
            Y[j][c] += scale * acc;
        }
    }
}

static const kern_lora kern__lora_ref = {"ref", kern__lora_shrink_ref, kern__lora_expand_ref,
                                         kern__lora_shrink16_ref, kern__lora_expand16_ref};
static const kern_lora kern__lora_avx2 = {"avx2", kern__avx2_lora_shrink, kern__avx2_lora_expand,
                                          kern__avx2_lora_shrink16, kern__avx2_lora_expand16};
static const kern_lora kern__lora_a512 = {"avx512", kern__a512_lora_shrink, kern__a512_lora_expand,
                                          kern__a512_lora_shrink16, kern__a512_lora_expand16};

const kern_lora *kern_lora_for(const kern_vtab *v) {
    if (!strcmp(v->name, "avx512")) return &kern__lora_a512;
    if (!strcmp(v->name, "avx2")) return &kern__lora_avx2;
    return &kern__lora_ref;
}
