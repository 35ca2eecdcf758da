/* test_cli.c — models made by `kvseal mkmodel` (llama with GQA, qwen2,
 * qwen3, gemma2, gemma3, glm4moe; every weight type) run the same on the
 * reference kernels and on every SIMD kernel set this CPU has: the same
 * greedy tokens, and logits within a per-type tolerance (justified at
 * kind_tol below). Gemma models with a 4-token sliding window are also batch
 * invariant (test_model.c checks that on kjv-mini for the others): windows
 * that start mid-page and span pages give the same bits alone or batched;
 * so is glm4moe, whose tokens are routed by a selection bias to experts
 * run over rows grouped from the whole batch, plus a shared expert.
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
    model_batch b = {N_PROMPT, prompt, pos, sq, outr, 1, 1, seqs, NULL, NULL};
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
        model_batch d = {1, &toks[i], pos, sq, outr, 1, 1, seqs, NULL, NULL};
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

/* Logits of steps [0, NG) of n_prompt-token prompt k then greedy decoding,
 * one token per step, on its own (1 thread, prefill in chunks of 3). */
enum { NG = 24 };
static void solo_run(const model *m, const int32_t *prompt, int n_prompt, float *lg) {
    ks_errbuf eb;
    kv_geom g = model_kv_geom(m, 16, KS_DTYPE_F16);
    kv_pool *pool;
    model_ctx *ctx;
    CHECK_EQ(kv_pool_create(&g, 8, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(m, pool, 1, 8, 64, &ctx, &eb), KS_OK);
    const int32_t V = model_hp(m)->n_vocab;
    kv_seq s;
    kv_seq_init(pool, &s);
    kv_seq *seqs[1] = {&s};
    CHECK_EQ(kv_seq_reserve(pool, &s, 64, &eb), KS_OK);
    int32_t tok = 0;
    for (int p = 0, step = 0; step < NG;) {
        int32_t tk[3], pos[3], sq[3] = {0}, outr[3], n = 0;
        if (p < n_prompt) { // a prefill chunk; logits only for the prompt's last token
            for (; n < 3 && p < n_prompt; n++, p++) {
                tk[n] = prompt[p];
                pos[n] = p;
                outr[n] = p == n_prompt - 1 ? 0 : -1;
            }
        } else {
            tk[0] = tok, pos[0] = p++, outr[0] = 0, n = 1;
        }
        bool out = outr[n - 1] == 0;
        model_batch b = {n, tk, pos, sq, outr, out ? 1 : 0, 1, seqs, NULL, NULL};
        CHECK_EQ(model_forward(ctx, &b, lg + (size_t)step * (size_t)V, &eb), KS_OK);
        if (!out) continue;
        const float *l = lg + (size_t)step * (size_t)V;
        tok = 0;
        for (int32_t j = 1; j < V; j++)
            if (l[j] > l[tok]) tok = j;
        step++;
    }
    kv_seq_release(pool, &s);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
}

/* Two sequences (prompts of 9 and 3 tokens) prefilled whole in one batch and
 * decoded together on 3 threads give the logits solo_run gives, bit for bit. */
static void test_batch_invariance(const char *path) {
    ks_errbuf eb;
    model *m;
    CHECK_EQ(model_load(path, &m, &eb), KS_OK);
    CHECK(model_hp(m)->n_swa == 4 || model_hp(m)->n_expert_shared == 1);
    const int32_t V = model_hp(m)->n_vocab;
    static const int32_t p0[] = {1, 300, 261, 345, 828, 325, 687, 2001, 548}, p1[] = {1, 1915, 425};
    const int32_t *ps[2] = {p0, p1};
    const int np[2] = {9, 3};
    float *ref = malloc(sizeof(float) * (size_t)V * NG * 2),
          *lg = malloc(sizeof(float) * (size_t)V * 2);
    for (int k = 0; k < 2; k++)
        solo_run(m, ps[k], np[k], ref + (size_t)k * NG * (size_t)V);
    kv_geom g = model_kv_geom(m, 16, KS_DTYPE_F16);
    kv_pool *pool;
    model_ctx *ctx;
    CHECK_EQ(kv_pool_create(&g, 16, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(m, pool, 3, 16, 64, &ctx, &eb), KS_OK);
    kv_seq s[2];
    kv_seq *seqs[2] = {&s[0], &s[1]};
    int32_t tk[16], pos[16], sq[16], outr[16], n = 0;
    for (int k = 0; k < 2; k++) {
        kv_seq_init(pool, &s[k]);
        CHECK_EQ(kv_seq_reserve(pool, &s[k], 64, &eb), KS_OK);
        for (int j = 0; j < np[k]; j++, n++)
            tk[n] = ps[k][j], pos[n] = j, sq[n] = k, outr[n] = j == np[k] - 1 ? k : -1;
    }
    for (int step = 0; step < NG; step++) {
        model_batch b = {n, tk, pos, sq, outr, 2, 2, seqs, NULL, NULL};
        CHECK_EQ(model_forward(ctx, &b, lg, &eb), KS_OK);
        int32_t next[2], p_next[2];
        for (int k = 0; k < 2; k++) {
            const float *l = lg + (size_t)k * (size_t)V;
            CHECK_MEM_EQ(l, ref + ((size_t)k * NG + (size_t)step) * (size_t)V,
                         sizeof(float) * (size_t)V);
            next[k] = 0;
            for (int32_t j = 1; j < V; j++)
                if (l[j] > l[next[k]]) next[k] = j;
            p_next[k] = np[k] + step;
        }
        n = 2;
        for (int k = 0; k < 2; k++)
            tk[k] = next[k], pos[k] = p_next[k], sq[k] = k, outr[k] = k;
    }
    for (int k = 0; k < 2; k++)
        kv_seq_release(pool, &s[k]);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
    model_free(m);
    free(ref);
    free(lg);
}

// ----------------------------------------------------------------------------
// glm4moe files kvseal refuses, and NextN blocks it never reads

typedef enum {
    G4_OK_NEXTN_JUNK, // the NextN block's tensors missing or of an unrunnable type: runs
    G4_SHARED_2,      // two shared experts, but tensors as wide as one
    G4_SHARED_9,      // more shared experts than kvseal runs
    G4_GROUPS,        // expert groups that do not divide the experts
    G4_NO_SHARED_KEY, // expert_shared_count absent (llama.cpp requires it)
    G4_NEXTN_ALL,     // every block a NextN block
    G4_MROPE,         // a vision release's rope.dimension_sections
    G4_NO_BIAS,       // a MoE layer without its selection bias
} g4_mutation;

/* Copies the glm4moe model at src (3 layers + NextN block 3) to dst with
 * one change. */
static void write_g4_mutant(const char *src, const char *dst, g4_mutation mu) {
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(src, &f, &eb), KS_OK);
    gguf_writer *w = gguf_writer_create();
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *key = gguf_kv_at(f, i)->key;
        if (mu == G4_NO_SHARED_KEY && !strcmp(key, "glm4moe.expert_shared_count")) continue;
        CHECK_EQ(gguf_writer_copy_kv(w, f, key), KS_OK);
    }
    if (mu == G4_SHARED_2 || mu == G4_SHARED_9)
        CHECK_EQ(gguf_writer_set_u32(w, "glm4moe.expert_shared_count", mu == G4_SHARED_2 ? 2 : 9),
                 KS_OK);
    if (mu == G4_GROUPS) CHECK_EQ(gguf_writer_set_u32(w, "glm4moe.expert_group_count", 3), KS_OK);
    if (mu == G4_NEXTN_ALL)
        CHECK_EQ(gguf_writer_set_u32(w, "glm4moe.nextn_predict_layers", 4), KS_OK);
    if (mu == G4_MROPE) {
        static const int32_t sections[4] = {4, 2, 2, 0};
        CHECK_EQ(
            gguf_writer_set_arr(w, "glm4moe.rope.dimension_sections", GGUF_TYPE_INT32, sections, 4),
            KS_OK);
    }
    static uint8_t junk[132 * 256]; // [512, 256] of IQ2_XXS: 2 blocks of 66 bytes a row
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (mu == G4_OK_NEXTN_JUNK && !strcmp(t->name, "blk.3.attn_q.weight")) continue;
        if (mu == G4_OK_NEXTN_JUNK && !strcmp(t->name, "blk.3.nextn.eh_proj.weight")) {
            CHECK(t->ne[0] == 512 && t->ne[1] == 256);
            CHECK_EQ(
                gguf_writer_add_tensor(w, t->name, 2, t->ne, KS_DTYPE_IQ2_XXS, junk, sizeof junk),
                KS_OK);
            continue;
        }
        if (mu == G4_NO_BIAS && !strcmp(t->name, "blk.2.exp_probs_b.bias")) continue;
        CHECK_EQ(gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, (ks_dtype)t->type, t->data,
                                        t->n_bytes),
                 KS_OK);
    }
    CHECK_EQ(gguf_writer_write(w, dst, &eb), KS_OK);
    gguf_writer_destroy(w);
    gguf_close(f);
}

/* The glm4moe model at path loads as 3 layers (the NextN block counted in
 * block_count, not run), and each mutant gets its one-line refusal. */
static void test_glm4moe_load(const char *path) {
    ks_errbuf eb;
    model *m;
    CHECK_EQ(model_load(path, &m, &eb), KS_OK);
    const model_hparams *hp = model_hp(m);
    CHECK(hp->n_layer == 3 && hp->n_layer_nextn == 1 && hp->n_layer_dense == 1);
    CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_expert_shared == 1);
    CHECK(hp->gating == MODEL_GATING_SIGMOID && hp->expert_norm && hp->expert_scale == 2.5f);
    CHECK(hp->rope_neox && hp->n_rot == hp->head_dim / 2 && !hp->post_norms);
    CHECK_EQ(model_kv_geom(m, 16, KS_DTYPE_F16).n_layer, 3); // no K/V for the NextN block
    model_free(m);
    struct {
        g4_mutation mu;
        ks_err err;
        const char *msg;
    } cases[] = {
        {G4_OK_NEXTN_JUNK, KS_OK, ""},
        {G4_SHARED_2, KS_ERR_FORMAT,
         "tensor 'blk.1.ffn_gate_shexp.weight' has shape [256, 256] (2 dims), expected [256, 512]"},
        {G4_SHARED_9, KS_ERR_UNSUPPORTED,
         "glm4moe.expert_shared_count 9: at most 8 shared experts are supported"},
        {G4_GROUPS, KS_ERR_FORMAT,
         "glm4moe.expert_group_count 3 / expert_group_used_count 3: want at most 64 groups of 2 "
         "or more of the 8 experts"},
        {G4_NO_SHARED_KEY, KS_ERR_FORMAT, "missing required key 'glm4moe.expert_shared_count'"},
        {G4_NEXTN_ALL, KS_ERR_FORMAT, "glm4moe.nextn_predict_layers 4 must be below block_count 4"},
        {G4_MROPE, KS_ERR_UNSUPPORTED,
         "glm4moe.rope.dimension_sections: multimodal RoPE (M-RoPE) sections are not supported"},
        {G4_NO_BIAS, KS_ERR_FORMAT, "missing tensor 'blk.2.exp_probs_b.bias'"},
    };
    char dst[256];
    snprintf(dst, sizeof dst, "/tmp/ks_test_cli_g4_%d.gguf", (int)getpid());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_g4_mutant(path, dst, cases[i].mu);
        ks_errbuf_clear(&eb);
        CHECK_EQ(model_check(dst, &eb), cases[i].err);
        CHECK_STR_HAS(eb.msg, cases[i].msg);
        if (cases[i].err) CHECK_STR_HAS(eb.msg, dst); // the file is named
    }
    unlink(dst);
}

int main(void) {
    const char *src = getenv("KS_SRC");
    char vocab[1024], path[256];
    snprintf(vocab, sizeof vocab, "%s/models/kjv-mini.gguf", src ? src : ".");
    snprintf(path, sizeof path, "/tmp/ks_test_cli_%d.gguf", (int)getpid());
    const char *archs[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "glm4moe"};
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"};
    const char *isas[] = {"avx2", "avx512"};
    int32_t ref_toks[N_GEN], toks[N_GEN], V = 0;
    float *ref = malloc(sizeof(float) * 2048 * N_GEN), *lg = malloc(sizeof(float) * 2048 * N_GEN);
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            // gemma: a 4-token window (so it slides within these 24 positions), a
            // score cap that bites (gemma2), a final cap for gemma3 too
            char *argv[] = {"mkmodel",
                            "-o",
                            path,
                            "--vocab",
                            vocab,
                            "--arch",
                            (char *)archs[a],
                            "--type",
                            (char *)types[t],
                            "--shape",
                            "tiny",
                            "--seed",
                            "7",
                            "--swa",
                            "4",
                            "--attn-softcap",
                            "2",
                            "--final-softcap",
                            "30",
                            NULL};
            CHECK_EQ(cli_mkmodel(strncmp(archs[a], "gemma", 5) ? 13 : 19, argv), 0);
            if ((!strncmp(archs[a], "gemma", 5) || !strcmp(archs[a], "glm4moe")) && t == 1)
                test_batch_invariance(path);
            if (!strcmp(archs[a], "glm4moe") && t == 1) test_glm4moe_load(path);
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
