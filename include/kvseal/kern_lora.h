/* kern_lora.h — the two halves of a batched LoRA delta (model.h "LoRA
 * adapters"), as punica's SGMV shrink and expand: U = X A^T for the tokens
 * that share an adapter, then Y += scale * U B^T, so each factor is read
 * once for the group instead of once per token.
 *
 * Beside kern.h's vtab, as kern_ssm.h: kern_lora_for picks the
 * implementation for a vtab by its ISA. Every output element is computed
 * whole by one call, in an order fixed by the shapes alone (never by how
 * many tokens share the call, which of them, or which slice of the outputs
 * it covers), so a token's delta is batch invariant. The SIMD versions
 * match the reference within f32 rounding. No pointer needs alignment.
 *
 * The _f16 variants read A and Bt as IEEE binary16 (llama.cpp's F16
 * factors kept as they are, half the bytes to stream); each value is
 * widened exactly to f32 and then summed as the f32 version would, so
 * they equal the f32 kernels on the widened factors bit for bit. */
#ifndef KS_KERN_LORA_H
#define KS_KERN_LORA_H

#include "kvseal/kern.h"

/* Shrink: U[j * ldu + i] = A_i . X[j] (K terms) for tokens j < n and
 * ranks i in [i0, i1). A is (r, K) row-major (row i is A_i), X[j] token
 * j's K inputs, U (n, ldu) the caller's. Can't fail. */
typedef void (*kern_lora_shrink_fn)(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                                    const float *const *X, float *U, int64_t ldu);
/* Expand: Y[j][c] += scale * sum_i Bt[i * N + c] U[j * ldu + i] (i < r,
 * summed in index order) for tokens j < n and columns c in [c0, c1). Bt is
 * B transposed, (r, N) row-major; Y[j] token j's N outputs, updated in
 * place. Can't fail. */
typedef void (*kern_lora_expand_fn)(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1,
                                    int n, const float *U, int64_t ldu, float scale,
                                    float *const *Y);

/* Shrink with A as binary16 bits (otherwise as kern_lora_shrink_fn). Can't fail. */
typedef void (*kern_lora_shrink16_fn)(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                                      const float *const *X, float *U, int64_t ldu);
/* Expand with Bt as binary16 bits (otherwise as kern_lora_expand_fn). Can't fail. */
typedef void (*kern_lora_expand16_fn)(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0,
                                      int64_t c1, int n, const float *U, int64_t ldu, float scale,
                                      float *const *Y);

typedef struct kern_lora {
    const char *name; /* the ISA: "ref", "avx2", "avx512" */
    kern_lora_shrink_fn shrink;
    kern_lora_expand_fn expand;
    kern_lora_shrink16_fn shrink_f16;
    kern_lora_expand16_fn expand_f16;
} kern_lora;

/* The LoRA kernels for vtab v's ISA (AVX-512, AVX2, or the reference): a
 * static table, never NULL. Can't fail. */
const kern_lora *kern_lora_for(const kern_vtab *v);

#endif
