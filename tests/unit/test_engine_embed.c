/* test_engine_embed.c — embeddings on the shipped kjv-mini model (issue 13):
 * - model_forward_hidden's rows are the normed final state: with
 *   n_out 0 they come out alone, and the same rows come out of a pass that
 *   also computes logits;
 * - mean pooling equals the mean of every position's row, last pooling the
 *   last row, both L2-normalized (norm 1), and the two differ;
 * - batch invariance: an input's vector is bit-identical alone, batched with
 *   other embeddings and a generation, and chunked differently (the
 *   engine's max_batch_tokens);
 * - admission: empty input, an input above n_ctx (context_length_exceeded),
 *   an id out of range are refused before any page is taken; after every
 *   request the pool is all free and scrubbed (pages released once, I3). */
#include "kvseal/admit.h"
#include "kvseal/engine.h"
#include "kvseal/kern.h"

#include "../check.h"

#include <math.h>

static model *g_model;
static int32_t E;

#define TEXT_A "In the beginning God created the heaven and the earth."
#define TEXT_B                                                                                     \
    "And the earth was without form, and void; and darkness was upon the face of the deep."
#define TEXT_C "And God said, Let there be light: and there was light."

static engine *make_engine(int32_t batch, model_pooling pooling) {
    engine_opts o;
    engine_opts_default(&o);
    o.m = g_model;
    o.n_threads = 2;
    o.n_ctx = 256;
    o.kv_pages = 64;
    o.max_running = 8;
    o.max_batch_tokens = batch;
    o.pooling = pooling;
    engine *e;
    ks_errbuf eb;
    if (engine_create(&o, &e, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        CHECK(0);
    }
    return e;
}

static void tokenize(const char *text, int32_t **ids, size_t *n) {
    ks_errbuf eb;
    CHECK_EQ(tok_encode(model_vocab(g_model), text, strlen(text), true, false, ids, n, &eb), KS_OK);
}

static engine_req *submit(engine *e, const int32_t *ids, size_t n, model_pooling p) {
    engine_embed_params ep = {.tenant = "t", .tokens = ids, .n_tokens = (int32_t)n, .pooling = p};
    engine_req *r;
    ks_errbuf eb;
    ks_err err = engine_embed_submit(e, &ep, &r, &eb);
    if (err) fprintf(stderr, "%s\n", eb.msg);
    CHECK_EQ(err, KS_OK);
    return r;
}

/* Waits for r's done event and copies its vector into out (E floats). */
static void take(engine_req *r, float *out, int32_t n_prompt) {
    engine_event ev;
    for (;;) {
        CHECK_EQ(engine_req_next(r, &ev, TEST_WAIT_MS), KS_OK);
        CHECK(ev.token < 0); // an embedding posts no token
        if (ev.done) break;
    }
    CHECK_EQ(ev.state, ENGINE_FINISHED);
    CHECK_EQ(ev.n_prompt, n_prompt);
    CHECK_EQ(ev.n_gen, 0);
    CHECK_EQ(engine_req_embedding(r, out, E), KS_OK);
    CHECK_EQ(engine_req_embedding(r, out, E - 1), KS_ERR_INVAL); // cap too small
    engine_req_release(r);
}

static void check_clean(engine *e) {
    ks_errbuf eb;
    ks_err err = engine_check_quiescent(e, 30000, &eb);
    if (err) fprintf(stderr, "%s\n", eb.msg);
    CHECK_EQ(err, KS_OK);
}

static double norm2(const float *v) {
    double s = 0;
    for (int32_t i = 0; i < E; i++)
        s += (double)v[i] * v[i];
    return sqrt(s);
}

/* The hidden rows of one whole input in one pass (n_out 0: no logits). */
static float *reference_rows(const int32_t *ids, size_t n, bool with_logits) {
    kv_geom g = model_kv_geom(g_model, 16, KS_DTYPE_F16);
    kv_pool *pool;
    model_ctx *ctx;
    ks_errbuf eb;
    CHECK_EQ(kv_pool_create(&g, 32, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(g_model, pool, 2, 256, 256, &ctx, &eb), KS_OK);
    kv_seq seq;
    kv_seq_init(pool, &seq);
    CHECK_EQ(kv_seq_reserve(pool, &seq, (uint32_t)n, &eb), KS_OK);
    int32_t *pos = malloc(sizeof(int32_t) * n * 4), *sq = pos + n, *outr = sq + n, *hid = outr + n;
    float *rows = malloc(sizeof(float) * n * (size_t)E);
    float *logits = malloc(sizeof(float) * (size_t)model_hp(g_model)->n_vocab);
    CHECK(pos && rows && logits);
    for (size_t i = 0; i < n; i++)
        pos[i] = (int32_t)i, sq[i] = 0, hid[i] = (int32_t)i, outr[i] = -1;
    if (with_logits) outr[n - 1] = 0;
    kv_seq *seqs[1] = {&seq};
    model_batch b = {.n_tokens = (int32_t)n,
                     .tokens = ids,
                     .pos = pos,
                     .seq = sq,
                     .out_row = outr,
                     .n_out = with_logits ? 1 : 0,
                     .n_seqs = 1,
                     .seqs = seqs};
    model_hidden h = {.row = hid, .n_rows = (int32_t)n, .out = rows};
    CHECK_EQ(model_forward_hidden(ctx, &b, logits, &h, &eb), KS_OK);
    // a hidden row beyond n_rows, or a count that does not match, is refused
    // before anything runs
    hid[0] = (int32_t)n;
    CHECK_EQ(model_forward_hidden(ctx, &b, logits, &h, &eb), KS_ERR_INVAL);
    hid[0] = 0;
    h.n_rows = (int32_t)n - 1;
    CHECK_EQ(model_forward_hidden(ctx, &b, logits, &h, &eb), KS_ERR_INVAL);
    kv_seq_release(pool, &seq);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
    free(pos);
    free(logits);
    return rows;
}

static void test_pooling(void) {
    int32_t *ids;
    size_t n;
    tokenize(TEXT_B, &ids, &n);
    CHECK(n > 16); // more than one chunk of 16 below
    float *rows = reference_rows(ids, n, false);
    float *rows2 = reference_rows(ids, n, true);
    CHECK_MEM_EQ(rows, rows2, sizeof(float) * n * (size_t)E); // logits or not: the same rows
    // the reference mean and last, by hand
    double *mean = calloc((size_t)E, sizeof(double));
    float *ref_mean = malloc(sizeof(float) * (size_t)E),
          *ref_last = malloc(sizeof(float) * (size_t)E),
          *ref_cls = malloc(sizeof(float) * (size_t)E);
    double ss = 0, sl = 0, sc = 0;
    for (int32_t i = 0; i < E; i++) {
        for (size_t t = 0; t < n; t++)
            mean[i] += rows[t * (size_t)E + i];
        mean[i] /= (double)n;
        ss += mean[i] * mean[i];
        double l = rows[(n - 1) * (size_t)E + i];
        sl += l * l;
        sc += (double)rows[i] * rows[i];
    }
    for (int32_t i = 0; i < E; i++) {
        ref_mean[i] = (float)(mean[i] / sqrt(ss));
        ref_last[i] = (float)(rows[(n - 1) * (size_t)E + i] / sqrt(sl));
        ref_cls[i] = (float)(rows[i] / sqrt(sc));
    }
    // the engine, chunked by 16 (several steps) and by 256 (one)
    float *v = malloc(sizeof(float) * (size_t)E), *w = malloc(sizeof(float) * (size_t)E);
    float *last = malloc(sizeof(float) * (size_t)E), *cls = malloc(sizeof(float) * (size_t)E);
    engine *e = make_engine(16, MODEL_POOL_DEFAULT);
    take(submit(e, ids, n, MODEL_POOL_DEFAULT), v,
         (int32_t)n); // kjv-mini has no pooling_type: mean
    take(submit(e, ids, n, MODEL_POOL_LAST), last, (int32_t)n);
    take(submit(e, ids, n, MODEL_POOL_CLS), cls, (int32_t)n); // the first position's row
    check_clean(e);
    engine_destroy(e);
    e = make_engine(256, MODEL_POOL_MEAN);
    take(submit(e, ids, n, MODEL_POOL_DEFAULT), w, (int32_t)n);
    check_clean(e);
    engine_destroy(e);
    CHECK_MEM_EQ(v, w, sizeof(float) * (size_t)E); // chunking does not change a bit
    double diff_mean = 0, diff_last = 0, diff_ml = 0, diff_cls = 0;
    for (int32_t i = 0; i < E; i++) {
        diff_mean = fmax(diff_mean, fabs((double)v[i] - ref_mean[i]));
        diff_last = fmax(diff_last, fabs((double)last[i] - ref_last[i]));
        diff_ml = fmax(diff_ml, fabs((double)v[i] - last[i]));
        diff_cls = fmax(diff_cls, fabs((double)cls[i] - ref_cls[i]));
    }
    CHECK(diff_mean < 1e-6);
    CHECK(diff_last < 1e-6);
    CHECK(diff_cls < 1e-6);
    CHECK(diff_ml > 1e-3); // mean and last pooling differ
    CHECK_NEAR(norm2(v), 1.0, 1e-5);
    CHECK_NEAR(norm2(last), 1.0, 1e-5);
    CHECK_EQ(model_pooling_default(g_model), MODEL_POOL_MEAN);
    model_pooling p = MODEL_POOL_DEFAULT;
    CHECK(model_pooling_parse("last", &p) && p == MODEL_POOL_LAST);
    CHECK(model_pooling_parse("cls", &p) && p == MODEL_POOL_CLS);
    CHECK(!model_pooling_parse("max", &p) && p == MODEL_POOL_CLS);
    CHECK(!strcmp(model_pooling_name(MODEL_POOL_CLS), "cls"));
    free(mean);
    free(ref_mean);
    free(ref_last);
    free(ref_cls);
    free(cls);
    free(rows);
    free(rows2);
    free(v);
    free(w);
    free(last);
    free(ids);
}

static void test_batch_invariance(void) {
    int32_t *a, *b, *c;
    size_t na, nb, nc;
    tokenize(TEXT_A, &a, &na);
    tokenize(TEXT_B, &b, &nb);
    tokenize(TEXT_C, &c, &nc);
    float *alone = malloc(sizeof(float) * (size_t)E), *batched = malloc(sizeof(float) * (size_t)E);
    float *vb = malloc(sizeof(float) * (size_t)E), *vc = malloc(sizeof(float) * (size_t)E);
    float *b_alone = malloc(sizeof(float) * (size_t)E);
    engine *e = make_engine(32, MODEL_POOL_MEAN);
    take(submit(e, a, na, MODEL_POOL_DEFAULT), alone, (int32_t)na);
    take(submit(e, b, nb, MODEL_POOL_DEFAULT), b_alone, (int32_t)nb);
    // A again, batched with two other inputs and a running generation of the
    // same tenant over B's tokens, whose full prompt pages go to the prefix
    // cache: an embedding never attaches them (it reads no other request's
    // pages)
    engine_params gp = {0};
    gp.tenant = "t";
    gp.prompt = b;
    gp.n_prompt = (int32_t)nb;
    gp.max_tokens = 24;
    gp.ignore_eos = true;
    sample_params_default(&gp.sp);
    engine_req *gen;
    ks_errbuf eb;
    CHECK_EQ(engine_submit(e, &gp, &gen, &eb), KS_OK);
    CHECK(nb > 16);
    for (;;) { // B's prompt is computed and published before the embeddings come
        engine_event ev;
        CHECK_EQ(engine_req_next(gen, &ev, TEST_WAIT_MS), KS_OK);
        if (ev.token >= 0 || ev.done) break;
    }
    engine_req *rb = submit(e, b, nb, MODEL_POOL_DEFAULT);
    engine_req *ra = submit(e, a, na, MODEL_POOL_DEFAULT);
    engine_req *rc = submit(e, c, nc, MODEL_POOL_DEFAULT);
    take(rb, vb, (int32_t)nb);
    take(ra, batched, (int32_t)na);
    take(rc, vc, (int32_t)nc);
    CHECK_MEM_EQ(alone, batched, sizeof(float) * (size_t)E);
    CHECK_MEM_EQ(b_alone, vb, sizeof(float) * (size_t)E);     // no prefix-cache attach
    CHECK(memcmp(alone, vb, sizeof(float) * (size_t)E) != 0); // other inputs, other vectors
    for (;;) {
        engine_event ev;
        CHECK_EQ(engine_req_next(gen, &ev, TEST_WAIT_MS), KS_OK);
        if (ev.done) {
            CHECK_EQ(ev.n_gen, 24); // the generation ran beside them, unharmed
            CHECK_EQ(ev.n_cached, 0);
            break;
        }
    }
    CHECK_EQ(engine_req_embedding(gen, vb, E), KS_ERR_INVAL); // not an embedding
    engine_req_release(gen);
    check_clean(e);
    engine_destroy(e);
    free(alone);
    free(b_alone);
    free(batched);
    free(vb);
    free(vc);
    free(a);
    free(b);
    free(c);
}

static void test_admission(void) {
    engine *e = make_engine(32, MODEL_POOL_MEAN);
    engine_stats st0, st1;
    engine_get_stats(e, &st0);
    ks_errbuf eb;
    engine_req *r = NULL;
    int32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = 5 + i % 50;
    engine_embed_params ep = {.tenant = "t", .tokens = ids, .n_tokens = 0};
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK_STR_HAS(eb.msg, "empty");
    CHECK(r == NULL);
    ep.n_tokens = 257; // n_ctx 256
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_CONTEXT_LENGTH);
    CHECK_STR_HAS(eb.msg, "maximum context length is 256 tokens");
    CHECK_STR_HAS(eb.msg, "257 tokens");
    ep.n_tokens = 256; // exactly the context: admitted
    r = NULL;
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_OK);
    float *v = malloc(sizeof(float) * (size_t)E);
    take(r, v, 256);
    CHECK_NEAR(norm2(v), 1.0, 1e-5);
    ids[3] = model_hp(g_model)->n_vocab;
    ep.n_tokens = 10;
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "out of range");
    ids[3] = -1;
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_ERR_INVAL);
    ids[3] = 7;
    ep.pooling = (model_pooling)4; // llama.cpp's RANK: not supported
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_ERR_INVAL);
    engine_get_stats(e, &st1);
    CHECK_EQ(st1.n_rejected - st0.n_rejected, 5u);
    // a cancelled embedding releases its pages too
    ep.pooling = MODEL_POOL_DEFAULT;
    ep.n_tokens = 200;
    CHECK_EQ(engine_embed_submit(e, &ep, &r, &eb), KS_OK);
    engine_req_release(r); // cancels if still running
    check_clean(e);
    engine_destroy(e);
    free(v);
}

int main(void) {
    const char *src = getenv("KS_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/kjv-mini.gguf", src ? src : ".");
    ks_errbuf eb;
    CHECK_EQ(kern_init(NULL, &eb), KS_OK);
    if (model_load(path, &g_model, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    E = model_hp(g_model)->n_embd;
    test_pooling();
    test_batch_invariance();
    test_admission();
    model_free(g_model);
    printf("engine embed ok\n");
    return 0;
}
