/* test_model_lora.c — LoRA adapters (model.h "LoRA adapters") on a tiny
 * F32 mkmodel llama:
 * - the applied delta equals the naive reference: the logits of base +
 *   adapter match those of a base whose matrices are W + scale B A,
 *   computed here in double, within float tolerance (and the adapter does
 *   move the logits far more than that tolerance);
 * - an adapter with B = 0 gives exactly the base logits; F16 factors act
 *   as the F32 ones within their rounding;
 * - per sequence: in one batch a sequence without the adapter gets exactly
 *   the base logits and one with it exactly its logits alone (batch
 *   invariance), on any number of threads, and a user scale of 0 gives
 *   the base exactly;
 * - mixed batches of two adapters and none, over more tokens than one of
 *   the batched delta's windows: each sequence exactly as alone, on 1-3
 *   threads, with the SIMD kernels and with the reference forced; the two
 *   within rounding of each other; the same with both adapters' factors
 *   F16 (kept as f16: model_lora_bytes half the F32 adapter's);
 * - loading refusals: wrong general.type / adapter.type, architecture
 *   mismatch, unknown tensor, layer out of range (or misspelt), a base
 *   matrix that cannot be targeted, wrong dims, rank mismatch
 *   between A and B, a missing factor, an unsupported type, no tensors. */
#include "kvseal/kern.h"
#include "kvseal/model.h"

#include "../check.h"
#include "free_watch.h"
#include "gguf_patch.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#define R 4          // the adapters' rank
#define ALPHA 8.0f   // their alpha: scale 2
#define NTOK 12

static char g_dir[256];
static int g_nth = 2; // threads of the passes run() makes

typedef struct {
    const char *name;
    int64_t ne0, ne1;
    ks_dtype type;
    const float *x; // (ne1, ne0)
} ad_tensor;

/* Writes an adapter with these keys (NULL: key left out) and tensors. */
static void write_adapter(const char *path, const char *arch, const char *gtype,
                          const char *atype, float alpha, const ad_tensor *t, int n) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    if (arch) CHECK_EQ(gguf_writer_set_str(w, "general.architecture", arch), KS_OK);
    if (gtype) CHECK_EQ(gguf_writer_set_str(w, "general.type", gtype), KS_OK);
    if (atype) CHECK_EQ(gguf_writer_set_str(w, "adapter.type", atype), KS_OK);
    if (alpha > 0) CHECK_EQ(gguf_writer_set_f32(w, "adapter.lora.alpha", alpha), KS_OK);
    void *bufs[16];
    CHECK(n <= 16);
    for (int i = 0; i < n; i++) {
        uint64_t rb = 0;
        CHECK(ks_dtype_row_bytes(t[i].type, (uint64_t)t[i].ne0, &rb));
        bufs[i] = malloc((size_t)rb * (size_t)t[i].ne1);
        CHECK(bufs[i] != NULL);
        for (int64_t r = 0; r < t[i].ne1; r++)
            kern_quantize_row(t[i].type, t[i].x + (size_t)r * (size_t)t[i].ne0,
                              (char *)bufs[i] + (size_t)r * rb, t[i].ne0);
        const int64_t ne[2] = {t[i].ne0, t[i].ne1};
        CHECK_EQ(gguf_writer_add_tensor(w, t[i].name, 2, ne, t[i].type, bufs[i],
                                        rb * (uint64_t)t[i].ne1),
                 KS_OK);
    }
    ks_errbuf eb;
    CHECK_EQ(gguf_writer_write(w, path, &eb), KS_OK);
    gguf_writer_destroy(w);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static float *rand_mat(int64_t n, uint32_t seed, float amp) {
    float *x = malloc(sizeof(float) * (size_t)n);
    CHECK(x != NULL);
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * amp;
    }
    return x;
}

/* Logits (NTOK, V) of ns sequences run in one batch, their tokens
 * interleaved: sequence q with adapter loras[q] (NULL: none) reads tokens
 * drawn with offset tok_off[q] (NULL: all 0); its logits into outs[q]. */
static void run_n(const model *m, int ns, const model_lora *const *loras, const int *tok_off,
                  float *const *outs) {
    const int32_t V = model_hp(m)->n_vocab;
    kv_geom g = model_kv_geom(m, 16, KS_DTYPE_F32);
    ks_errbuf eb;
    kv_pool *pool;
    model_ctx *ctx;
    enum { MAX_NS = 8 };
    CHECK(ns >= 1 && ns <= MAX_NS);
    CHECK_EQ(kv_pool_create(&g, 16 * MAX_NS, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(m, pool, g_nth, MAX_NS * NTOK, 64, &ctx, &eb), KS_OK);
    kv_seq s[MAX_NS];
    kv_seq *seqs[MAX_NS];
    for (int i = 0; i < ns; i++) {
        seqs[i] = &s[i];
        kv_seq_init(pool, &s[i]);
        CHECK_EQ(kv_seq_reserve(pool, &s[i], NTOK, &eb), KS_OK);
    }
    int32_t tk[MAX_NS * NTOK], pos[MAX_NS * NTOK], sq[MAX_NS * NTOK], outr[MAX_NS * NTOK];
    bool any = false;
    for (int i = 0; i < ns * NTOK; i++) {
        const int j = i / ns, q = i % ns; // sequence q's j-th token
        tk[i] = (int32_t)((j * 37 + 5 + (tok_off ? tok_off[q] : 0)) % V);
        pos[i] = j;
        sq[i] = q;
        outr[i] = q * NTOK + j;
    }
    for (int q = 0; q < ns; q++) any = any || loras[q];
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)(ns * NTOK));
    CHECK(logits != NULL);
    model_batch b = {.n_tokens = ns * NTOK, .tokens = tk, .pos = pos, .seq = sq, .out_row = outr,
                     .n_out = ns * NTOK, .n_seqs = ns, .seqs = seqs, .lora = any ? loras : NULL};
    CHECK_EQ(model_forward(ctx, &b, logits, &eb), KS_OK);
    for (int q = 0; q < ns; q++)
        memcpy(outs[q], logits + (size_t)V * NTOK * (size_t)q, sizeof(float) * (size_t)V * NTOK);
    free(logits);
    for (int i = 0; i < ns; i++) kv_seq_release(pool, &s[i]);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
}

/* Logits (NTOK, V) of one sequence of tokens run in one batch, with lora
 * (NULL: none); or, with two, a second sequence of the same tokens in the
 * same batch with lora2 (its logits into out2). */
static void run(const model *m, const model_lora *lora, const model_lora *lora2, bool two,
                float *out, float *out2) {
    const model_lora *loras[2] = {lora, lora2};
    float *outs[2] = {out, out2};
    run_n(m, two ? 2 : 1, loras, NULL, outs);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - (double)b[i]);
        d = x > d ? x : d;
    }
    return d;
}

static bool all_equal(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* Eight sequences mixing adapter l, adapter l2 and none, each reading its
 * own tokens (84 with an adapter: more than one of lora.c's 64-token
 * windows), under the kernels kern_init chose: each sequence's logits are
 * exactly those it gets alone, on 1, 2 and 3 threads. The lone runs'
 * logits into alone[8]. */
static void check_mixed(const model *base, const model_lora *l, const model_lora *l2,
                        float *const *alone) {
    const size_t n = (size_t)model_hp(base)->n_vocab * NTOK;
    const model_lora *mix[8] = {l, NULL, l2, l, l2, l, l2, l};
    const int offs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int q = 0; q < 8; q++) run_n(base, 1, &mix[q], &offs[q], &alone[q]);
    CHECK(!all_equal(alone[0], alone[3], n)); // the sequences do differ
    float *got[8];
    for (int q = 0; q < 8; q++) CHECK((got[q] = malloc(sizeof(float) * n)) != NULL);
    for (g_nth = 1; g_nth <= 3; g_nth++) {
        run_n(base, 8, mix, offs, got);
        for (int q = 0; q < 8; q++) {
            if (!all_equal(got[q], alone[q], n))
                fprintf(stderr, "%s, %d threads: sequence %d differs from alone by %.3g\n",
                        kern_get()->name, g_nth, q, max_abs_diff(got[q], alone[q], n));
            CHECK(all_equal(got[q], alone[q], n));
        }
    }
    g_nth = 2;
    for (int q = 0; q < 8; q++) free(got[q]);
}

/* The targets the reference merges: layer, name, K, N of the tiny shape. */
typedef struct {
    int il;
    const char *what;
} tgt;

static const tgt k_tgts[] = {{0, "attn_q"}, {0, "attn_v"},   {1, "attn_output"},
                             {1, "ffn_up"}, {0, "ffn_down"}, {1, "ffn_gate"}, {1, "attn_k"}};
#define N_TGTS (int)(sizeof k_tgts / sizeof k_tgts[0])

/* model_lora_free(l), checking that every factor was zero when freed (an
 * adapter is a tenant's fine-tune: I3 for weights). */
static void free_scrubbed(model_lora *l) {
    const int32_t n = model_lora_factors(l, 0, &(const void *){0}, &(size_t){0},
                                         &(const void *){0}, &(size_t){0});
    for (int32_t i = 0; i < n; i++) {
        const void *a, *bt;
        size_t na, nb;
        model_lora_factors(l, i, &a, &na, &bt, &nb);
        free_watch_add(a, na);
        free_watch_add(bt, nb);
    }
    model_lora_free(l);
    int freed, dirty;
    const int w = free_watch_end(&freed, &dirty);
    printf("scrub: %d factor blocks watched, %d freed, %d not zero when freed\n", w, freed, dirty);
    CHECK(w >= 2);
    CHECK_EQ(freed, w);
    CHECK_EQ(dirty, 0);
}

static void test_reference(const char *base_path, const char *merged_path) {
    ks_errbuf eb;
    model *base = NULL;
    CHECK_EQ(model_load(base_path, &base, &eb), KS_OK);
    const int32_t V = model_hp(base)->n_vocab;
    gguf_file *f;
    CHECK_EQ(gguf_open(base_path, &f, &eb), KS_OK);
    ad_tensor t[2 * N_TGTS];
    char names[2 * N_TGTS][96];
    float *facs[2 * N_TGTS];
    for (int i = 0; i < N_TGTS; i++) {
        char wn[64];
        snprintf(wn, sizeof wn, "blk.%d.%s.weight", k_tgts[i].il, k_tgts[i].what);
        const gguf_tensor *w = gguf_find_tensor(f, wn);
        CHECK(w != NULL);
        const int64_t K = w->ne[0], N = w->ne[1];
        facs[2 * i] = rand_mat(K * R, 11u + (uint32_t)i, 0.08f);
        facs[2 * i + 1] = rand_mat(R * N, 101u + (uint32_t)i, 0.08f);
        snprintf(names[2 * i], sizeof names[0], "%s.lora_a", wn);
        snprintf(names[2 * i + 1], sizeof names[0], "%s.lora_b", wn);
        t[2 * i] = (ad_tensor){names[2 * i], K, R, KS_DTYPE_F32, facs[2 * i]};
        t[2 * i + 1] = (ad_tensor){names[2 * i + 1], R, N, KS_DTYPE_F32, facs[2 * i + 1]};
    }
    gguf_close(f);
    char ad[300], ad0[300];
    snprintf(ad, sizeof ad, "%s/ad.gguf", g_dir);
    write_adapter(ad, "llama", "adapter", "lora", ALPHA, t, 2 * N_TGTS);
    // the merged base: W + (alpha / r) B A, in double, for every target
    const double scale = ALPHA / R;
    for (int i = 0; i < N_TGTS; i++) {
        char wn[64];
        snprintf(wn, sizeof wn, "blk.%d.%s.weight", k_tgts[i].il, k_tgts[i].what);
        CHECK_EQ(gguf_open(merged_path, &f, &eb), KS_OK);
        const gguf_tensor *w = gguf_find_tensor(f, wn);
        CHECK(w && w->type == KS_DTYPE_F32);
        const int64_t K = w->ne[0], N = w->ne[1];
        float *buf = malloc(w->n_bytes);
        CHECK(buf != NULL);
        const float *A = facs[2 * i], *B = facs[2 * i + 1];
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                double d = 0;
                for (int r = 0; r < R; r++) d += (double)B[n * R + r] * (double)A[r * K + k];
                buf[n * K + k] = (float)((double)((const float *)w->data)[n * K + k] + scale * d);
            }
        gp_write(merged_path, f, w, buf);
    }
    model *merged = NULL;
    CHECK_EQ(model_load(merged_path, &merged, &eb), KS_OK);
    model_lora *l = NULL;
    if (model_lora_load(base, ad, &l, &eb)) fprintf(stderr, "%s\n", eb.msg);
    CHECK(l != NULL);
    CHECK_EQ(model_lora_rank(l), R);
    CHECK_EQ(model_lora_n_mats(l), N_TGTS);
    CHECK(fabsf(model_lora_scale(l) - 2.0f) < 1e-6f);
    const size_t n = (size_t)V * NTOK;
    float *lb = malloc(sizeof(float) * n), *ll = malloc(sizeof(float) * n),
          *lm = malloc(sizeof(float) * n), *l2 = malloc(sizeof(float) * n);
    CHECK(lb && ll && lm && l2);
    run(base, NULL, NULL, false, lb, NULL);
    run(base, l, NULL, false, ll, NULL);
    run(merged, NULL, NULL, false, lm, NULL);
    double span = 0;
    for (size_t i = 0; i < n; i++) span = fabs(lm[i]) > span ? fabs(lm[i]) : span;
    const double d_ref = max_abs_diff(ll, lm, n), d_base = max_abs_diff(ll, lb, n);
    printf("reference: |lora - merged| %.3g, |lora - base| %.3g (logits up to %.3g)\n", d_ref,
           d_base, span);
    CHECK(d_ref <= 1e-4 * span + 1e-5);
    CHECK(d_base > 100 * d_ref && d_base > 1e-3 * span);
    // per sequence in one batch: none / the adapter, each exactly as alone
    run(base, NULL, l, true, l2, lm);
    CHECK(all_equal(l2, lb, n));
    CHECK(all_equal(lm, ll, n));
    run(base, l, NULL, true, l2, lm);
    CHECK(all_equal(l2, ll, n));
    CHECK(all_equal(lm, lb, n));
    // and on 1 or 3 threads
    for (g_nth = 1; g_nth <= 3; g_nth += 2) {
        run(base, l, NULL, false, l2, NULL);
        CHECK(all_equal(l2, ll, n));
    }
    g_nth = 2;
    // a second adapter, of rank 36, on four of the targets: mixed batches of
    // both and none (its tokens make the batched delta's work large enough
    // for pool runs; the rank-4 adapter's alone run on the calling thread)
    float *f2[8];
    ad_tensor t2[8];
    for (int i = 0; i < 8; i++) {
        t2[i] = t[i];
        if (i % 2) t2[i].ne0 = 36; // B: ne [r, N]
        else t2[i].ne1 = 36;       // A: ne [K, r]
        f2[i] = rand_mat(t2[i].ne0 * t2[i].ne1, 700u + (uint32_t)i, 0.03f);
        t2[i].x = f2[i];
    }
    char ad2[300];
    snprintf(ad2, sizeof ad2, "%s/ad2.gguf", g_dir);
    write_adapter(ad2, "llama", "adapter", "lora", ALPHA, t2, 8);
    model_lora *lb2 = NULL;
    CHECK_EQ(model_lora_load(base, ad2, &lb2, &eb), KS_OK);
    float *simd[8], *refk[8];
    for (int q = 0; q < 8; q++) {
        simd[q] = malloc(sizeof(float) * n);
        refk[q] = malloc(sizeof(float) * n);
        CHECK(simd[q] && refk[q]);
    }
    check_mixed(base, l, lb2, simd);
    // the reference kernels forced (KS_FORCE_ISA=ref's kern_init): the same
    // invariance, and the same logits within rounding
    CHECK_EQ(kern_init("ref", &eb), KS_OK);
    check_mixed(base, l, lb2, refk);
    CHECK_EQ(kern_init(NULL, &eb), KS_OK);
    double d_isa = 0;
    for (int q = 0; q < 8; q++) {
        const double d = max_abs_diff(simd[q], refk[q], n);
        d_isa = d > d_isa ? d : d_isa;
    }
    printf("mixed batch: |%s - ref| %.3g\n", kern_get()->name, d_isa);
    CHECK(d_isa <= 1e-4 * span + 1e-5);
    // both adapters with F16 factors (kept as binary16, the kernels' f16
    // variants): the same invariance under the SIMD and the reference kernels
    ad_tensor t16[2 * N_TGTS], t2_16[8];
    for (int i = 0; i < 2 * N_TGTS; i++)
        t16[i] = t[i], t16[i].type = KS_DTYPE_F16;
    for (int i = 0; i < 8; i++)
        t2_16[i] = t2[i], t2_16[i].type = KS_DTYPE_F16;
    char ad16[300], ad2_16[300];
    snprintf(ad16, sizeof ad16, "%s/ad16.gguf", g_dir);
    snprintf(ad2_16, sizeof ad2_16, "%s/ad2_16.gguf", g_dir);
    write_adapter(ad16, "llama", "adapter", "lora", ALPHA, t16, 2 * N_TGTS);
    write_adapter(ad2_16, "llama", "adapter", "lora", ALPHA, t2_16, 8);
    model_lora *l16 = NULL, *lb2_16 = NULL;
    CHECK_EQ(model_lora_load(base, ad16, &l16, &eb), KS_OK);
    CHECK_EQ(model_lora_load(base, ad2_16, &lb2_16, &eb), KS_OK);
    CHECK(model_lora_bytes(l16) > 0 && 2 * model_lora_bytes(l16) == model_lora_bytes(l));
    CHECK(2 * model_lora_bytes(lb2_16) == model_lora_bytes(lb2));
    check_mixed(base, l16, lb2_16, simd);
    CHECK_EQ(kern_init("ref", &eb), KS_OK);
    check_mixed(base, l16, lb2_16, refk);
    CHECK_EQ(kern_init(NULL, &eb), KS_OK);
    d_isa = 0;
    for (int q = 0; q < 8; q++) {
        const double d = max_abs_diff(simd[q], refk[q], n);
        d_isa = d > d_isa ? d : d_isa;
    }
    printf("mixed batch, f16 factors: |%s - ref| %.3g\n", kern_get()->name, d_isa);
    CHECK(d_isa <= 1e-4 * span + 1e-5);
    model_lora_free(l16);
    model_lora_free(lb2_16);
    unlink(ad16);
    unlink(ad2_16);
    for (int q = 0; q < 8; q++) free(simd[q]), free(refk[q]);
    for (int i = 0; i < 8; i++) free(f2[i]);
    model_lora_free(lb2);
    unlink(ad2);
    // the user's scale multiplies the delta: 0 gives the base exactly
    model_lora_set_scale(l, 0.0f);
    CHECK(model_lora_scale(l) == 0.0f);
    run(base, l, NULL, false, l2, NULL);
    CHECK(all_equal(l2, lb, n));
    free_scrubbed(l); // f32 factors
    // B = 0: exactly the base's logits
    for (int i = 0; i < N_TGTS; i++) memset(facs[2 * i + 1], 0, sizeof(float) * (size_t)(R * t[2 * i + 1].ne1));
    snprintf(ad0, sizeof ad0, "%s/ad0.gguf", g_dir);
    write_adapter(ad0, "llama", "adapter", "lora", ALPHA, t, 2 * N_TGTS);
    CHECK_EQ(model_lora_load(base, ad0, &l, &eb), KS_OK);
    run(base, l, NULL, false, ll, NULL);
    CHECK(all_equal(ll, lb, n));
    model_lora_free(l);
    // F16 and Q8_0 factors load and act like the F32 ones, within their rounding
    for (int i = 0; i < N_TGTS; i++) {
        free(facs[2 * i + 1]);
        facs[2 * i + 1] = rand_mat(R * t[2 * i + 1].ne1, 101u + (uint32_t)i, 0.08f);
        t[2 * i + 1].x = facs[2 * i + 1];
        t[2 * i].type = KS_DTYPE_F16;
        t[2 * i + 1].type = KS_DTYPE_F16;
    }
    write_adapter(ad0, "llama", "adapter", "lora", ALPHA, t, 2 * N_TGTS);
    CHECK_EQ(model_lora_load(base, ad0, &l, &eb), KS_OK);
    run(base, l, NULL, false, l2, NULL);
    run(merged, NULL, NULL, false, lm, NULL);
    const double d16 = max_abs_diff(l2, lm, n);
    printf("f16 factors: |lora - merged| %.3g\n", d16);
    CHECK(d16 < 0.05 * d_base);
    free_scrubbed(l); // f16 factors
    for (int i = 0; i < 2 * N_TGTS; i++) free(facs[i]);
    free(lb), free(ll), free(lm), free(l2);
    model_free(merged);
    model_free(base);
    unlink(ad);
    unlink(ad0);
}

/* Loading ad_path against base fails with code, and the message has want. */
static void expect_refusal(const model *base, const char *ad_path, ks_err code, const char *want) {
    model_lora *l = (model_lora *)1;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    const ks_err e = model_lora_load(base, ad_path, &l, &eb);
    if (e != code || !strstr(eb.msg, want))
        fprintf(stderr, "refusal: got %s [%s], want %s with [%s]\n", ks_err_name(e), eb.msg,
                ks_err_name(code), want);
    CHECK_EQ(e, code);
    CHECK(strstr(eb.msg, want) != NULL);
    CHECK(l == NULL);
}

static void test_refusals(const char *base_path) {
    ks_errbuf eb;
    model *base = NULL;
    CHECK_EQ(model_load(base_path, &base, &eb), KS_OK);
    const int64_t E = model_hp(base)->n_embd; // attn_q: [E, E]
    float *a = rand_mat(E * 64, 1, 0.1f), *b = rand_mat(64 * E, 2, 0.1f);
    char p[300];
    snprintf(p, sizeof p, "%s/bad.gguf", g_dir);
    const ad_tensor ok[2] = {{"blk.0.attn_q.weight.lora_a", E, R, KS_DTYPE_F32, a},
                             {"blk.0.attn_q.weight.lora_b", R, E, KS_DTYPE_F32, b}};
    // the good one loads (the refusals below differ from it in one thing)
    write_adapter(p, "llama", "adapter", "lora", ALPHA, ok, 2);
    model_lora *l = NULL;
    CHECK_EQ(model_lora_load(base, p, &l, &eb), KS_OK);
    CHECK_EQ(model_lora_n_mats(l), 1);
    model_lora_free(l);
    // no alpha: scale 1 (llama.cpp's)
    write_adapter(p, "llama", "adapter", "lora", 0, ok, 2);
    CHECK_EQ(model_lora_load(base, p, &l, &eb), KS_OK);
    CHECK(model_lora_scale(l) == 1.0f);
    model_lora_free(l);
    write_adapter(p, "llama", "model", "lora", ALPHA, ok, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "not 'adapter'");
    write_adapter(p, "llama", NULL, "lora", ALPHA, ok, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "not 'adapter'");
    write_adapter(p, "llama", "adapter", "control_vector", ALPHA, ok, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "not 'lora'");
    write_adapter(p, "qwen2", "adapter", "lora", ALPHA, ok, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'qwen2' is not the base model's 'llama'");
    ad_tensor t[2] = {ok[0], ok[1]};
    t[0].name = "blk.0.attn_zz.weight.lora_a";
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.0.attn_zz.weight.lora_a' names no matrix");
    t[0].name = "blk.7.attn_q.weight.lora_a"; // the tiny shape has 2 layers
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.7.attn_q.weight.lora_a' names no matrix");
    t[0].name = "blk.00.attn_q.weight.lora_a"; // not the base's spelling of layer 0
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.00.attn_q.weight.lora_a' names no matrix");
    t[0] = ok[0];
    t[0].name = "output.weight.lora_a"; // a base matrix the pass does not target
    t[1].name = "output.weight.lora_b";
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_UNSUPPORTED, "LoRA on 'output.weight' is not supported");
    t[0] = ok[0];
    t[1] = ok[1];
    t[0].ne0 = E + 32; // A's K is not W's
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.0.attn_q.weight.lora_a' has ne [288, 4]");
    t[0] = ok[0];
    t[1].ne1 = E - 32; // B's N is not W's
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.0.attn_q.weight.lora_b' has ne [4, 224]");
    t[1] = ok[1];
    t[1].ne0 = 2 * R; // rank 4 in A, 8 in B
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_FORMAT, "has rank 4 but 'blk.0.attn_q.weight.lora_b' 8");
    t[1] = ok[1];
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 1); // A alone
    expect_refusal(base, p, KS_ERR_FORMAT, "'blk.0.attn_q.weight.lora_a' has no lora_b");
    t[0].type = KS_DTYPE_Q4_0;
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    expect_refusal(base, p, KS_ERR_UNSUPPORTED, "is Q4_0 (F32, F16 or Q8_0 only)");
    t[0] = ok[0];
    t[0].ne1 = t[1].ne0 = 64; // another legal rank loads
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 2);
    CHECK_EQ(model_lora_load(base, p, &l, &eb), KS_OK);
    CHECK_EQ(model_lora_rank(l), 64);
    model_lora_free(l);
    write_adapter(p, "llama", "adapter", "lora", ALPHA, t, 0);
    expect_refusal(base, p, KS_ERR_FORMAT, "no LoRA tensors");
    // a forward pass refuses an adapter loaded for another model
    model *other = NULL;
    CHECK_EQ(model_load(base_path, &other, &eb), KS_OK);
    write_adapter(p, "llama", "adapter", "lora", ALPHA, ok, 2);
    CHECK_EQ(model_lora_load(other, p, &l, &eb), KS_OK);
    kv_geom g = model_kv_geom(base, 16, KS_DTYPE_F32);
    kv_pool *pool;
    model_ctx *ctx;
    CHECK_EQ(kv_pool_create(&g, 8, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(base, pool, 1, 4, 16, &ctx, &eb), KS_OK);
    kv_seq s;
    kv_seq_init(pool, &s);
    CHECK_EQ(kv_seq_reserve(pool, &s, 1, &eb), KS_OK);
    kv_seq *seqs[1] = {&s};
    const model_lora *ls[1] = {l};
    int32_t tk = 1, pos = 0, sq = 0, outr = 0;
    float *logits = malloc(sizeof(float) * (size_t)model_hp(base)->n_vocab);
    model_batch bt = {.n_tokens = 1, .tokens = &tk, .pos = &pos, .seq = &sq, .out_row = &outr,
                      .n_out = 1, .n_seqs = 1, .seqs = seqs, .lora = ls};
    CHECK_EQ(model_forward(ctx, &bt, logits, &eb), KS_ERR_INVAL);
    CHECK(strstr(eb.msg, "another model") != NULL);
    free(logits);
    kv_seq_release(pool, &s);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
    model_lora_free(l);
    model_free(other);
    free(a), free(b);
    unlink(p);
    model_free(base);
}

int main(void) {
    ks_errbuf eb;
    CHECK_EQ(kern_init(NULL, &eb), KS_OK);
    snprintf(g_dir, sizeof g_dir, "/tmp/ks_lora_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    char base[300], merged[300];
    snprintf(base, sizeof base, "%s/base.gguf", g_dir);
    snprintf(merged, sizeof merged, "%s/merged.gguf", g_dir);
    if (!gp_mkmodel(base, "--shape tiny --seed 7") || !gp_mkmodel(merged, "--shape tiny --seed 7")) {
        rmdir(g_dir);
        return 77;
    }
    test_refusals(base);
    test_reference(base, merged);
    unlink(base);
    unlink(merged);
    rmdir(g_dir);
    printf("test_model_lora: ok\n");
    return 0;
}
