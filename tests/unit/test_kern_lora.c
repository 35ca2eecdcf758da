/* test_kern_lora.c — the batched LoRA kernels (kern_lora.h) on every ISA
 * this CPU has:
 * - shrink and expand match the reference within f32 rounding (relative
 *   1e-5 of the terms' magnitude) on ranks and sizes around the vector
 *   widths (tails, 1, primes) and on unaligned rows;
 * - batch invariance: a token's U and Y elements are bit-identical whether
 *   it runs alone or at any place in a call of up to 9 tokens, and whatever
 *   slice of ranks or columns one call covers (the splits lora.c makes
 *   across threads), for the reference as for the SIMD kernels;
 * - the f16 variants: bit-identical to the same ISA's f32 kernels on the
 *   factors widened to f32 (so the above carries over), and batch
 *   invariant alone / at another place in a call / in any slice. */
#include "kvseal/kern_lora.h"

#include "../check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[3] = {"ref", "avx2", "avx512"};

static float *rand_vec(size_t n, uint32_t seed) {
    float *x = malloc(sizeof(float) * n + 64);
    CHECK(x != NULL);
    uint32_t s = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    return x;
}

#define NT 9 // tokens of the largest call: two tiles of 4 and a remainder

/* One shape: K inputs, rank r, N outputs; rows start off floats past an
 * aligned base (0: aligned; 1: every row misaligned). */
static void check_shape(const kern_lora *k, const kern_lora *ref, int64_t K, int32_t r, int64_t N,
                        int off) {
    float *A = rand_vec((size_t)(r * K) + (size_t)off, 1u + (uint32_t)K) + off;
    float *Bt = rand_vec((size_t)(r * N) + (size_t)off, 2u + (uint32_t)N) + off;
    float *xs = rand_vec((size_t)(NT * (K + 1)), 3u + (uint32_t)r);
    const float *X[NT];
    for (int j = 0; j < NT; j++) X[j] = xs + (size_t)j * (size_t)(K + 1) + (size_t)off; // K+1: misaligned rows
    const int64_t ldu = r + 3;
    float *U = calloc((size_t)(NT * ldu), sizeof(float)), *Ur = calloc((size_t)(NT * ldu), sizeof(float));
    float *U1 = calloc((size_t)ldu, sizeof(float));
    float *ys = rand_vec((size_t)(NT * (N + 1)), 4u), *yr = malloc(sizeof(float) * (size_t)(NT * (N + 1)));
    float *y1 = malloc(sizeof(float) * (size_t)(N + 1));
    CHECK(U && Ur && U1 && yr && y1);
    memcpy(yr, ys, sizeof(float) * (size_t)(NT * (N + 1)));
    float *Y[NT], *Yr[NT];
    for (int j = 0; j < NT; j++) {
        Y[j] = ys + (size_t)j * (size_t)(N + 1);
        Yr[j] = yr + (size_t)j * (size_t)(N + 1);
    }
    const float y0_1 = Y[1][0];
    float *y_start = malloc(sizeof(float) * (size_t)N); // token 1's row before the expand
    CHECK(y_start != NULL);
    memcpy(y_start, Y[1], sizeof(float) * (size_t)N);
    // shrink against the reference; rounding bound from sum |a x|
    k->shrink(K, A, 0, r, NT, X, U, ldu);
    ref->shrink(K, A, 0, r, NT, X, Ur, ldu);
    for (int j = 0; j < NT; j++)
        for (int32_t i = 0; i < r; i++) {
            double mag = 0;
            for (int64_t q = 0; q < K; q++) mag += fabs((double)A[i * K + q] * X[j][q]);
            const float got = U[j * ldu + i], want = Ur[j * ldu + i];
            if (fabs((double)got - want) > 1e-5 * mag + 1e-30)
                fprintf(stderr, "%s shrink K %lld r %d: U[%d][%d] %.9g want %.9g\n", k->name,
                        (long long)K, r, j, i, (double)got, (double)want);
            CHECK(fabs((double)got - want) <= 1e-5 * mag + 1e-30);
        }
    // each token alone, and the ranks in slices of 1, 3 and 5: the same bits
    for (int j = 0; j < NT; j++) {
        k->shrink(K, A, 0, r, 1, &X[j], U1, ldu);
        CHECK(memcmp(U1, U + j * ldu, sizeof(float) * (size_t)r) == 0);
        for (int step = 1; step <= 5; step += 2) {
            memset(U1, 0, sizeof(float) * (size_t)ldu);
            for (int32_t i = 0; i < r; i += step)
                k->shrink(K, A, i, i + step < r ? i + step : r, 1, &X[j], U1, ldu);
            CHECK(memcmp(U1, U + j * ldu, sizeof(float) * (size_t)r) == 0);
        }
    }
    // tokens 2.. in a call of their own (another place in a tile)
    k->shrink(K, A, 0, r, NT - 2, X + 2, Ur, ldu);
    CHECK(memcmp(Ur, U + 2 * ldu, sizeof(float) * (size_t)((NT - 2) * ldu - (ldu - r))) == 0);
    // expand (from the SIMD U) against the reference
    const float scale = 0.75f;
    k->expand(r, N, Bt, 0, N, NT, U, ldu, scale, Y);
    ref->expand(r, N, Bt, 0, N, NT, U, ldu, scale, Yr);
    for (int j = 0; j < NT; j++)
        for (int64_t c = 0; c < N; c++) {
            double mag = 0;
            for (int32_t i = 0; i < r; i++) mag += fabs((double)Bt[i * N + c] * U[j * ldu + i]);
            mag = mag * scale + fabs((double)Yr[j][c]);
            if (fabs((double)Y[j][c] - Yr[j][c]) > 1e-5 * mag + 1e-30)
                fprintf(stderr, "%s expand r %d N %lld: Y[%d][%lld] %.9g want %.9g\n", k->name, r,
                        (long long)N, j, (long long)c, (double)Y[j][c], (double)Yr[j][c]);
            CHECK(fabs((double)Y[j][c] - Yr[j][c]) <= 1e-5 * mag + 1e-30);
        }
    CHECK(Y[1][0] != y0_1); // it did add
    // token 1 alone, in column slices of 1, 7, 16 and 37: the same bits
    const int64_t steps[4] = {1, 7, 16, 37};
    for (int s = 0; s < 4; s++) {
        memcpy(y1, y_start, sizeof(float) * (size_t)N);
        for (int64_t c = 0; c < N; c += steps[s])
            k->expand(r, N, Bt, c, c + steps[s] < N ? c + steps[s] : N, 1, U + ldu, ldu, scale, &y1);
        CHECK(memcmp(y1, Y[1], sizeof(float) * (size_t)N) == 0);
    }
    free(A - off), free(Bt - off), free(xs), free(U), free(Ur), free(U1), free(ys), free(yr);
    free(y1), free(y_start);
}

/* Binary16 copies of n random values (bits) and their exact f32 widening. */
static uint16_t *rand_f16(size_t n, uint32_t seed, float **wide) {
    float *x = rand_vec(n, seed);
    uint16_t *h = malloc(sizeof *h * n + 64);
    CHECK(h != NULL);
    for (size_t i = 0; i < n; i++) {
        h[i] = ks_f32_to_f16(x[i]);
        x[i] = ks_f16_to_f32(h[i]);
    }
    *wide = x;
    return h;
}

/* The f16 kernels of k on one shape: the same bits as k's f32 kernels on
 * the widened factors, for the whole call, each token alone and in slices. */
static void check_f16(const kern_lora *k, int64_t K, int32_t r, int64_t N, int off) {
    float *Aw, *Btw;
    uint16_t *A = rand_f16((size_t)(r * K) + (size_t)off, 5u + (uint32_t)K, &Aw) + off;
    uint16_t *Bt = rand_f16((size_t)(r * N) + (size_t)off, 6u + (uint32_t)N, &Btw) + off;
    float *xs = rand_vec((size_t)(NT * (K + 1)), 7u + (uint32_t)r);
    const float *X[NT];
    for (int j = 0; j < NT; j++)
        X[j] = xs + (size_t)j * (size_t)(K + 1) + (size_t)off;
    const int64_t ldu = r + 3;
    float *U = calloc((size_t)(NT * ldu), sizeof(float)),
          *Uw = calloc((size_t)(NT * ldu), sizeof(float));
    float *U1 = calloc((size_t)ldu, sizeof(float));
    float *ys = rand_vec((size_t)(NT * (N + 1)), 8u),
          *yw = malloc(sizeof(float) * (size_t)(NT * (N + 1)));
    float *y1 = malloc(sizeof(float) * (size_t)(N + 1));
    CHECK(U && Uw && U1 && yw && y1);
    memcpy(yw, ys, sizeof(float) * (size_t)(NT * (N + 1)));
    memcpy(y1, ys + (N + 1), sizeof(float) * (size_t)N); // token 1's row before the expand
    float *Y[NT], *Yw[NT];
    for (int j = 0; j < NT; j++) {
        Y[j] = ys + (size_t)j * (size_t)(N + 1);
        Yw[j] = yw + (size_t)j * (size_t)(N + 1);
    }
    k->shrink_f16(K, A, 0, r, NT, X, U, ldu);
    k->shrink(K, Aw + off, 0, r, NT, X, Uw, ldu);
    CHECK(memcmp(U, Uw, sizeof(float) * (size_t)(NT * ldu)) == 0);
    for (int j = 0; j < NT; j++) {
        memset(U1, 0, sizeof(float) * (size_t)ldu);
        for (int32_t i = 0; i < r; i += 3)
            k->shrink_f16(K, A, i, i + 3 < r ? i + 3 : r, 1, &X[j], U1, ldu);
        CHECK(memcmp(U1, U + j * ldu, sizeof(float) * (size_t)r) == 0);
    }
    k->shrink_f16(K, A, 0, r, NT - 2, X + 2, Uw, ldu);
    CHECK(memcmp(Uw, U + 2 * ldu, sizeof(float) * (size_t)((NT - 2) * ldu - (ldu - r))) == 0);
    const float scale = 0.75f;
    k->expand_f16(r, N, Bt, 0, N, NT, U, ldu, scale, Y);
    k->expand(r, N, Btw + off, 0, N, NT, U, ldu, scale, Yw);
    for (int j = 0; j < NT; j++)
        CHECK(memcmp(Y[j], Yw[j], sizeof(float) * (size_t)N) == 0);
    for (int64_t c = 0; c < N; c += 7)
        k->expand_f16(r, N, Bt, c, c + 7 < N ? c + 7 : N, 1, U + ldu, ldu, scale, &y1);
    CHECK(memcmp(y1, Y[1], sizeof(float) * (size_t)N) == 0);
    free(A - off), free(Bt - off), free(Aw), free(Btw), free(xs), free(U), free(Uw), free(U1);
    free(ys), free(yw), free(y1);
}

int main(void) {
    ks_log_set_level(KS_LOG_WARN);
    const kern_lora *ref = kern_lora_for(kern_vtab_for("ref"));
    CHECK_STR_EQ(ref->name, "ref");
    static const int64_t Ks[] = {1, 7, 8, 15, 16, 17, 33, 64, 129, 1024};
    static const int32_t Rs[] = {1, 2, 3, 4, 5, 8, 16, 17, 64};
    static const int64_t Ns[] = {1, 5, 8, 16, 17, 31, 32, 33, 100, 1024};
    for (int iv = 0; iv < 3; iv++) {
        const kern_vtab *v = kern_vtab_for(isas[iv]);
        if (!v) {
            printf("  %s: not supported here, skipped\n", isas[iv]);
            continue;
        }
        const kern_lora *k = kern_lora_for(v);
        CHECK_STR_EQ(k->name, isas[iv]);
        for (size_t a = 0; a < sizeof Ks / sizeof Ks[0]; a++)
            for (size_t b = 0; b < sizeof Rs / sizeof Rs[0]; b++)
                check_shape(k, ref, Ks[a], Rs[b], Ns[(a + b) % (sizeof Ns / sizeof Ns[0])],
                            (int)((a + b) & 1));
        for (size_t a = 0; a < sizeof Ks / sizeof Ks[0]; a++)
            for (size_t b = 0; b < sizeof Rs / sizeof Rs[0]; b++)
                check_f16(k, Ks[a], Rs[b], Ns[(a + 2 * b) % (sizeof Ns / sizeof Ns[0])],
                          (int)((a + b) & 1));
        printf("  %s: ok\n", isas[iv]);
    }
    printf("test_kern_lora: ok\n");
    return 0;
}
