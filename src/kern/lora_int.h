/* lora_int.h — the batched LoRA kernels' implementations (kern_lora.h
 * states the contract): the reference in lora_ref.c, the SIMD ones in
 * lora_avx2.c and lora_avx512.c. Private to kern/ and its tests. */
#ifndef KS_KERN_LORA_INT_H
#define KS_KERN_LORA_INT_H

#include "kvseal/kern_lora.h"

/* The reference (kern_lora.h): each dot summed in index order, one f32 add at a time. */
void kern__lora_shrink_ref(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                           const float *const *X, float *U, int64_t ldu);
void kern__lora_expand_ref(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                           const float *U, int64_t ldu, float scale, float *const *Y);
/* The reference with binary16 factors, each widened exactly (ks_f16_to_f32). */
void kern__lora_shrink16_ref(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                             const float *const *X, float *U, int64_t ldu);
void kern__lora_expand16_ref(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                             int n, const float *U, int64_t ldu, float scale, float *const *Y);
/* AVX2 + FMA: shrink in 8 lanes along K (lane l sums k = l mod 8), expand
 * across 8 columns, fma chains over i. */
void kern__avx2_lora_shrink(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                            const float *const *X, float *U, int64_t ldu);
void kern__avx2_lora_expand(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                            const float *U, int64_t ldu, float scale, float *const *Y);
/* As above with binary16 factors widened by F16C. */
void kern__avx2_lora_shrink16(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                              const float *const *X, float *U, int64_t ldu);
void kern__avx2_lora_expand16(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                              int n, const float *U, int64_t ldu, float scale, float *const *Y);
/* AVX-512F: as AVX2's with 16 lanes. */
void kern__a512_lora_shrink(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                            const float *const *X, float *U, int64_t ldu);
void kern__a512_lora_expand(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                            const float *U, int64_t ldu, float scale, float *const *Y);
void kern__a512_lora_shrink16(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                              const float *const *X, float *U, int64_t ldu);
void kern__a512_lora_expand16(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                              int n, const float *U, int64_t ldu, float scale, float *const *Y);

#endif
