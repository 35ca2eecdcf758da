/* test_cli.c — models made by `kvseal mkmodel` (llama with GQA, qwen2,
 * qwen3; every weight type) run the same on the reference kernels and on
 * every SIMD kernel set this CPU has: the same greedy tokens, and logits
 * within a per-type tolerance (justified at kind_tol below).
 *
 * The vocabulary comes from the shipped kjv-mini, so this test never skips. */
#include "kvseal/cli.h"
#include "kvseal/kern.h"
#include "kvseal/model.h"

#include "../check.h"

#include <unistd.h>

enum { N_PROMPT = 8, N_GEN = 16 };

/* Greedy-decodes N_GEN tokens; logits of each step go to lg (N_GEN, V). */
static void run_greedy(const char *path, const char *isa, int32_t *toks, float *lg, int32_t *V) {
    ks_errbuf eb;
    CHECK_EQ(kern_init(isa, &eb), KS_OK);
    model *m;
    if (model_load(path, &m, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        CHECK(0);
    }
    *V = model_hp(m)->n_vocab;
    // f32 KV: this compares weight kernels across ISAs, and f16/q8_0 KV rounding
    // would add thresholds a last-bit difference can cross (measured: qwen3 q4_k
    // ref vs avx2 greedy tokens differ with f16 KV). KV types: test_model.c.
    kv_geom g = model_kv_geom(m, 16, KS_DTYPE_F32);
    kv_pool *pool;
    model_ctx *ctx;
    CHECK_EQ(kv_pool_create(&g, 4, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(m, pool, 2, N_PROMPT, 64, &ctx, &eb), KS_OK);
    kv_seq s;
    kv_seq_init(pool, &s);
    kv_seq *seqs[1] = {&s};
    CHECK_EQ(kv_seq_reserve(pool, &s, N_PROMPT + N_GEN, &eb), KS_OK);
    int32_t prompt[N_PROMPT] = {1, 300, 261, 345, 828, 325, 687, 2001};
    int32_t pos[N_PROMPT], sq[N_PROMPT] = {0}, outr[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        pos[i] = i;
        outr[i] = i == N_PROMPT - 1 ? 0 : -1;
    }
    model_batch b = {N_PROMPT, prompt, pos, sq, outr, 1, 1, seqs, NULL};
    CHECK_EQ(model_forward(ctx, &b, lg, &eb), KS_OK);
    for (int i = 0; i < N_GEN; i++) {
        const float *l = lg + (size_t)i * (size_t)*V;
        int32_t best = 0;
        for (int32_t j = 1; j < *V; j++)
            if (l[j] > l[best]) best = j;
        toks[i] = best;
        if (i + 1 == N_GEN) break;
        pos[0] = N_PROMPT + i;
        outr[0] = 0;
        model_batch d = {1, &toks[i], pos, sq, outr, 1, 1, seqs, NULL};
        CHECK_EQ(model_forward(ctx, &d, lg + (size_t)(i + 1) * (size_t)*V, &eb), KS_OK);
    }
    kv_seq_release(pool, &s);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
    model_free(m);
}

/* Largest |logit difference| allowed, relative to the largest |logit|.
 * Float weights (F32/F16/BF16) multiply f32 activations: SIMD and reference
 * differ only in f32 summation order (~1e-6 relative per dot; measured
 * worst over these models 3e-6 absolute on logits of ~16): 1e-4.
 * Quantized weights multiply activations re-quantized to int8 before every
 * matmul. The block integer dots are exact, but a last-bit difference in an
 * activation can move its int8 code across a rounding boundary, a step of
 * max|x|/127 (0.8% of the row's largest element), and that step propagates
 * to the logits at about that relative size. Measured worst: 0.104 on
 * logits of 15.1 (0.7%), in 2 of 24 quantized runs; most runs differ by
 * ~4e-6. Allowed: 1.5e-2. Greedy tokens must be equal, except that such a
 * step may flip a near-tie: where the reference's two best logits are
 * closer than the tolerance, another token may win, and the comparison
 * stops there (the inputs differ after it). */
static double kind_tol(const char *type) {
    return (!strcmp(type, "f32") || !strcmp(type, "f16") || !strcmp(type, "bf16")) ? 1e-4 : 1.5e-2;
}

int main(void) {
    const char *src = getenv("KS_SRC");
    char vocab[1024], path[256];
    snprintf(vocab, sizeof vocab, "%s/models/kjv-mini.gguf", src ? src : ".");
    snprintf(path, sizeof path, "/tmp/ks_test_cli_%d.gguf", (int)getpid());
    const char *archs[] = {"llama", "qwen2", "qwen3"};
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"};
    const char *isas[] = {"avx2", "avx512"};
    int32_t ref_toks[N_GEN], toks[N_GEN], V = 0;
    float *ref = malloc(sizeof(float) * 2048 * N_GEN), *lg = malloc(sizeof(float) * 2048 * N_GEN);
    for (size_t a = 0; a < 3; a++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            char *argv[] = {"mkmodel", "-o", path, "--vocab", vocab, "--arch", (char *)archs[a],
                            "--type", (char *)types[t], "--shape", "tiny", "--seed", "7", NULL};
            CHECK_EQ(cli_mkmodel(13, argv), 0);
            run_greedy(path, "ref", ref_toks, ref, &V);
            CHECK(V == 2048);
            double mx0 = 0;
            for (int i = 0; i < V; i++) mx0 = fabs(ref[i]) > mx0 ? fabs(ref[i]) : mx0;
            CHECK(mx0 > 1.0);  // a model whose logits are all ~0 would prove nothing
            double mx = 0;
            for (int i = 0; i < N_GEN * V; i++) mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
            for (size_t k = 0; k < 2; k++) {
                if (!kern_vtab_for(isas[k])) continue;
                run_greedy(path, isas[k], toks, lg, &V);
                int n = 0; // steps with the same inputs: up to the first differing token
                while (n < N_GEN && toks[n] == ref_toks[n])
                    n++;
                const int ns = n < N_GEN ? n + 1 : N_GEN;
                double worst = 0;
                for (int i = 0; i < ns * V; i++) {
                    double d = fabs((double)lg[i] - (double)ref[i]);
                    worst = d > worst ? d : worst;
                }
                double gap = 0; // the reference's margin for its token where they part
                if (n < N_GEN)
                    gap = ref[(size_t)n * (size_t)V + (size_t)ref_toks[n]] -
                          ref[(size_t)n * (size_t)V + (size_t)toks[n]];
                fprintf(stderr, "%-6s %-5s %-7s max|dlogit| %.3g (max|logit| %.3g) tokens %s",
                        archs[a], types[t], isas[k], worst, mx, n < N_GEN ? "part" : "same");
                if (n < N_GEN) fprintf(stderr, " at step %d, a near-tie (margin %.3g)", n, gap);
                fprintf(stderr, "\n");
                CHECK(worst <= kind_tol(types[t]) * mx);
                CHECK(n == N_GEN || gap <= kind_tol(types[t]) * mx);
            }
        }
    }
    unlink(path);
    free(ref);
    free(lg);
    printf("cli ok\n");
    return 0;
}
