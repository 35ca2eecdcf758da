/* test_engine_choices.c — issue 12's sampling features on the shipped
 * kjv-mini model:
 * - logit_bias in the sampler: +100 forces a token, -100 bans the argmax,
 *   validation names the bad entry; sample_logprobs_row is the log-softmax;
 * - n > 1 (engine_submit_n): choice i's tokens equal an n=1 request seeded
 *   seed + i (so batch invariance holds per choice), the choices share the
 *   prompt's full pages (the pool allocates exactly the group arithmetic's
 *   pages, not n copies), and every page is released exactly once, whether
 *   the choices end at different times, one is cancelled, or all are;
 * - prompt logprobs (echo): each prompt token's logprob equals the
 *   log-softmax of model_forward's logits at the position before it, the
 *   first has none, and max_tokens 0 ends after the prompt. */
#include "kvseal/engine.h"
#include "kvseal/kern.h"

#include "../check.h"
#include "engine_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static engine *make_engine(uint32_t pages, int max_running) {
    // no prefix cache: page counts below are the group's alone
    engine_opts o = efx_opts(512, pages, max_running, false);
    o.queue_timeout_ms = 60000;
    return efx_engine(&o);
}

typedef struct {
    int32_t toks[256];
    int n;
    int n_prompt_ev;
    engine_event pev[256]; // prompt events
    engine_event done;
} result;

static void collect(engine_req *r, result *res) {
    memset(res, 0, sizeof *res);
    for (;;) {
        engine_event ev;
        CHECK_EQ(engine_req_next(r, &ev, 60000), KS_OK);
        if (ev.prompt) {
            CHECK(res->n == 0); // prompt events come first
            CHECK(res->n_prompt_ev < 256);
            res->pev[res->n_prompt_ev++] = ev;
        } else if (ev.token >= 0) {
            CHECK(res->n < 256);
            res->toks[res->n++] = ev.token;
        }
        if (ev.done) {
            res->done = ev;
            return;
        }
    }
}

static void params(engine_params *p, const int32_t *ids, size_t n, int max_tokens, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->tenant = "t";
    p->prompt = ids;
    p->n_prompt = (int32_t)n;
    p->max_tokens = max_tokens;
    sample_params_default(&p->sp);
    p->sp.temperature = 1.0f; // sampled, so each choice's seed shows
    p->sp.top_k = 0;
    p->sp.top_p = 1.0f;
    p->sp.min_p = 0.0f;
    p->sp.seed = seed;
    p->ignore_eos = true; // every choice runs max_tokens: exact page arithmetic
}

static const char *PROMPT = "In the beginning God created the heaven and the earth. And the earth "
                            "was without form, and void; and darkness was upon the face";

// ----------------------------------------------------------------------------
// Sampler: logit_bias and the logprobs of a row

static void test_bias_sampler(void) {
    enum { V = 64 };
    float base[V], l[V];
    for (int i = 0; i < V; i++)
        base[i] = (float)((i * 37) % 11) * 0.3f; // argmax: id 10 (3.0)
    sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    sampler *s;
    ks_errbuf eb;
    CHECK_EQ(sampler_create(&p, V, &s, &eb), KS_OK);
    sample_result r;
    memcpy(l, base, sizeof l);
    sampler_sample(s, l, &r);
    int32_t top = r.token;
    CHECK_EQ(top, 8);
    // +100 forces a low token
    sample_bias b1[] = {{3, 100.0f}};
    CHECK_EQ(sampler_set_bias(s, b1, 1, &eb), KS_OK);
    memcpy(l, base, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 3);
    // -100 bans the argmax: the runner-up wins
    sample_bias b2[] = {{top, -100.0f}};
    CHECK_EQ(sampler_set_bias(s, b2, 1, &eb), KS_OK);
    memcpy(l, base, sizeof l);
    sampler_sample(s, l, &r);
    CHECK(r.token != top);
    CHECK_NEAR(l[top], base[top] - 100.0f, 1e-4); // applied in place, as documented
    // at temperature 1 a banned token is never drawn
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    sampler *s2;
    CHECK_EQ(sampler_create(&p, V, &s2, &eb), KS_OK);
    CHECK_EQ(sampler_set_bias(s2, b2, 1, &eb), KS_OK);
    for (int k = 0; k < 2000; k++) {
        memcpy(l, base, sizeof l);
        sampler_sample(s2, l, &r);
        CHECK(r.token != top);
    }
    // no bias again: the argmax is back
    CHECK_EQ(sampler_set_bias(s, NULL, 0, &eb), KS_OK);
    memcpy(l, base, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, top);
    // validation
    sample_bias bad_id[] = {{V, 1.0f}};
    CHECK_EQ(sampler_set_bias(s, bad_id, 1, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "token id 64 out of range [0, 64)");
    sample_bias bad_v[] = {{1, 100.5f}};
    CHECK_EQ(sampler_set_bias(s, bad_v, 1, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "must be in [-100, 100], got 100.5");
    sample_bias nan_v[] = {{1, NAN}};
    CHECK_EQ(sample_bias_validate(nan_v, 1, V, &eb), KS_ERR_INVAL);
    CHECK_EQ(sample_bias_validate(b1, SAMPLE_MAX_BIAS + 1, V, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "at most 1024 entries");
    // the row's logprobs: log-softmax in double
    double M = 3.0, Z = 0;
    for (int i = 0; i < V; i++)
        Z += exp((double)base[i] - M);
    sample_logprobs_row(base, V, 7, 5, &r);
    CHECK_EQ(r.token, 7);
    CHECK_NEAR(r.logprob, (double)base[7] - M - log(Z), 1e-5);
    CHECK_EQ(r.n_top, 5);
    CHECK_EQ(r.top_ids[0], 8);
    CHECK_NEAR(r.top_logprobs[0], -log(Z), 1e-5);
    sampler_destroy(s);
    sampler_destroy(s2);
}

// ----------------------------------------------------------------------------
// n > 1: per-choice seeds, shared pages, released once

/* n = N choices against each choice alone (seed + i), and (sp >= 0: no
 * prefix cache) the pool's page count for the group: choice 0's pages, each
 * other choice's own pages past the shared ones, and each sequence's sp
 * recurrent-state pages. */
static void check_group(engine *e, int sp) {
    int32_t *ids;
    size_t n_ids;
    tokenize(PROMPT, &ids, &n_ids);
    CHECK(n_ids > 17); // at least one full shared page
    enum { N = 4, MAXT = 20 };
    const uint64_t seed = 1234567;
    // reference: each choice alone, n = 1 with seed + i
    result alone[N];
    for (int i = 0; i < N; i++) {
        engine_params p;
        params(&p, ids, n_ids, MAXT, seed + (uint64_t)i);
        engine_req *r;
        ks_errbuf eb;
        CHECK_EQ(engine_submit(e, &p, &r, &eb), KS_OK);
        collect(r, &alone[i]);
        engine_req_release(r);
        CHECK_EQ(alone[i].n, MAXT);
    }
    check_clean(e);
    // different seeds give different choices (else the test below proves little)
    CHECK(memcmp(alone[0].toks, alone[1].toks, sizeof(int32_t) * MAXT) != 0);

    engine_stats st0, st1;
    engine_get_stats(e, &st0);
    engine_params p;
    params(&p, ids, n_ids, MAXT, seed);
    engine_req *rs[ENGINE_MAX_N];
    ks_errbuf eb;
    CHECK_EQ(engine_submit_n(e, &p, N, rs, &eb), KS_OK);
    result got[N];
    for (int i = 0; i < N; i++)
        collect(rs[i], &got[i]);
    engine_get_stats(e, &st1);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(got[i].done.state, ENGINE_FINISHED);
        CHECK_EQ(got[i].n, MAXT);
        CHECK_MEM_EQ(got[i].toks, alone[i].toks, sizeof(int32_t) * MAXT);
        engine_req_release(rs[i]);
    }
    // pages: choice 0's prompt + completion, and each other choice only its
    // own pages past the shared ones
    const uint32_t P = 16, total = (uint32_t)(n_ids + MAXT + P - 1) / P,
                   shared = (uint32_t)(n_ids - 1) / P;
    CHECK(shared >= 1);
    if (sp >= 0)
        CHECK_EQ(st1.kv.allocations - st0.kv.allocations,
                 total + (uint32_t)sp + (N - 1) * (total - shared + (uint32_t)sp));
    check_clean(e); // every page FREE and scrubbed: released, and only once (refcounts asserted)
    free(ids);
}

static void test_n_choices(void) {
    engine *e = make_engine(128, 8);
    check_group(e, 0);
    int32_t *ids;
    size_t n_ids;
    tokenize(PROMPT, &ids, &n_ids);
    enum { N = 4, MAXT = 20 };
    const uint64_t seed = 1234567;
    engine_params p;
    engine_req *rs[ENGINE_MAX_N];
    ks_errbuf eb;
    result got[N];
    result alone2;
    params(&p, ids, n_ids, MAXT, seed + 2);
    CHECK_EQ(engine_submit(e, &p, &rs[0], &eb), KS_OK);
    collect(rs[0], &alone2);
    engine_req_release(rs[0]);

    // choices ending at different times: one cancelled after its first token
    params(&p, ids, n_ids, MAXT, seed);
    CHECK_EQ(engine_submit_n(e, &p, 3, rs, &eb), KS_OK);
    engine_event ev;
    do
        CHECK_EQ(engine_req_next(rs[1], &ev, 60000), KS_OK);
    while (ev.token < 0 && !ev.done);
    engine_req_cancel(rs[1]);
    collect(rs[0], &got[0]);
    collect(rs[2], &got[2]);
    CHECK_EQ(got[0].n, MAXT);
    CHECK_MEM_EQ(got[2].toks, alone2.toks, sizeof(int32_t) * MAXT);
    for (int i = 0; i < 3; i++)
        engine_req_release(rs[i]);
    check_clean(e);

    // every choice cancelled at once, before the prompt is computed (the
    // waiting choices end with their choice 0)
    params(&p, ids, n_ids, MAXT, seed);
    CHECK_EQ(engine_submit_n(e, &p, N, rs, &eb), KS_OK);
    for (int i = 0; i < N; i++)
        engine_req_release(rs[i]);
    check_clean(e);

    // refusals: n out of range, above max_running, a group that never fits
    CHECK_EQ(engine_submit_n(e, &p, 0, rs, &eb), KS_ERR_INVAL);
    CHECK_EQ(engine_submit_n(e, &p, ENGINE_MAX_N + 1, rs, &eb), KS_ERR_INVAL);
    CHECK_EQ(engine_submit_n(e, &p, 9, rs, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "at most 8 sequences");
    params(&p, ids, n_ids, 400, seed); // 8 x ~26 own pages > 128
    CHECK_EQ(engine_submit_n(e, &p, 8, rs, &eb), KS_ERR_NOSPACE);
    CHECK_STR_HAS(eb.msg, "KV pages");
    sample_bias bad[] = {{1 << 30, 1.0f}};
    params(&p, ids, n_ids, MAXT, seed);
    p.bias = bad;
    p.n_bias = 1;
    CHECK_EQ(engine_submit_n(e, &p, 2, rs, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "logit_bias");
    check_clean(e);
    free(ids);
    engine_destroy(e);
}

// ----------------------------------------------------------------------------
// Prompt logprobs against model_forward

static void test_prompt_logprobs(void) {
    // a prompt longer than one step's prompt rows (64): two passes
    char text[2048] = "";
    for (int i = 0; i < 3; i++)
        strcat(text, PROMPT);
    int32_t *ids;
    size_t n;
    tokenize(text, &ids, &n);
    CHECK(n > 70 && n < 200);
    const int32_t V = model_hp(g_model)->n_vocab;

    // reference: one forward pass over the whole prompt, every row out
    kv_geom g = model_kv_geom(g_model, 16, KS_DTYPE_F16);
    kv_pool *pool;
    model_ctx *ctx;
    ks_errbuf eb;
    CHECK_EQ(kv_pool_create(&g, 64, KV_SCRUB_ZERO, &pool, &eb), KS_OK);
    CHECK_EQ(model_ctx_create(g_model, pool, 2, 256, 512, &ctx, &eb), KS_OK);
    kv_seq seq;
    kv_seq_init(pool, &seq);
    CHECK_EQ(kv_seq_reserve(pool, &seq, (uint32_t)n, &eb), KS_OK);
    int32_t *pos = malloc(sizeof(int32_t) * n * 3), *sq = pos + n, *outr = sq + n;
    float *logits = malloc(sizeof(float) * n * (size_t)V);
    CHECK(pos && logits);
    for (size_t i = 0; i < n; i++)
        pos[i] = (int32_t)i, sq[i] = 0, outr[i] = (int32_t)i;
    kv_seq *seqs[1] = {&seq};
    model_batch b = {(int32_t)n, ids, pos, sq, outr, (int32_t)n, 1, seqs, NULL, NULL};
    CHECK_EQ(model_forward(ctx, &b, logits, &eb), KS_OK);

    engine *e = make_engine(64, 4);
    for (int max_tokens = 0; max_tokens <= 3; max_tokens += 3) {
        engine_params p;
        params(&p, ids, n, max_tokens, 7);
        p.ignore_eos = false;
        p.prompt_logprobs = true;
        p.prompt_top = 5;
        engine_req *r;
        CHECK_EQ(engine_submit(e, &p, &r, &eb), KS_OK);
        result res;
        collect(r, &res);
        engine_req_release(r);
        CHECK_EQ(res.done.state, ENGINE_FINISHED);
        CHECK_EQ(res.n_prompt_ev, (int)n);
        CHECK(res.pev[0].no_logprob);
        CHECK_EQ(res.pev[0].token, ids[0]);
        for (size_t i = 1; i < n; i++) {
            const engine_event *ev = &res.pev[i];
            CHECK(!ev->no_logprob);
            CHECK_EQ(ev->token, ids[i]);
            sample_result ref;
            sample_logprobs_row(logits + (i - 1) * (size_t)V, V, ids[i], 5, &ref);
            CHECK_NEAR(ev->sr.logprob, ref.logprob, 1e-4);
            CHECK_EQ(ev->sr.n_top, 5);
            CHECK_EQ(ev->sr.top_ids[0], ref.top_ids[0]);
            CHECK_NEAR(ev->sr.top_logprobs[0], ref.top_logprobs[0], 1e-4);
        }
        if (max_tokens == 0) {
            CHECK_EQ(res.n, 0);
            CHECK_EQ(res.done.n_gen, 0);
            CHECK_EQ(res.done.finish, ENGINE_FINISH_LENGTH);
        } else {
            CHECK(res.n <= 3);
        }
    }
    check_clean(e);
    engine_destroy(e);
    kv_seq_release(pool, &seq);
    model_ctx_free(ctx);
    kv_pool_destroy(pool);
    free(pos);
    free(logits);
    free(ids);
}

/* A hybrid recurrent model (qwen35, made by `kvseal mkmodel`): the other
 * choices share choice 0's full prompt pages and start from a copy of its
 * recurrent state at their end (the prefill stops there to hand it over),
 * so each still equals its n = 1 twin, with the page count above. */
static void test_n_choices_hybrid(void) {
    const char *bin = getenv("KS_BIN"), *src = getenv("KS_SRC");
    if (!bin || !src) {
        printf("note: KS_BIN or KS_SRC unset: n > 1 on a hybrid model not checked\n");
        return;
    }
    char dir[] = "/tmp/ks-choices-XXXXXX", path[512], cmd[2048];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/q35.gguf", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' mkmodel -o '%s' --vocab '%s/models/kjv-mini.gguf' --arch qwen35 --n-layer 4 "
             "--seed 11 >/dev/null",
             bin, path, src);
    CHECK_EQ(system(cmd), 0);
    model *kjv = g_model;
    ks_errbuf eb;
    CHECK_EQ(model_load(path, &g_model, &eb), KS_OK);
    engine *e = make_engine(256, 8);
    const int sp = model_kv_geom(g_model, 16, KS_DTYPE_F16).state_pages; // the default pages
    CHECK(sp > 0);
    check_group(e, sp);
    engine_destroy(e);
    // with the prefix cache, an n = 1 run keeps the state at the boundary:
    // choice 0 of a group resumes right there and hands it over at once
    engine_opts o = efx_opts(512, 256, 8, true);
    o.queue_timeout_ms = 60000;
    e = efx_engine(&o);
    int32_t *ids;
    size_t n_ids;
    tokenize(PROMPT, &ids, &n_ids);
    engine_params p;
    params(&p, ids, n_ids, 20, 99 + 1);
    engine_req *rs[3];
    static result one, got[3];
    CHECK_EQ(engine_submit(e, &p, &rs[0], &eb), KS_OK);
    collect(rs[0], &one);
    engine_req_release(rs[0]);
    engine_stats st0, st1;
    engine_get_stats(e, &st0);
    params(&p, ids, n_ids, 20, 99);
    CHECK_EQ(engine_submit_n(e, &p, 3, rs, &eb), KS_OK);
    for (int i = 0; i < 3; i++)
        collect(rs[i], &got[i]);
    engine_get_stats(e, &st1);
    CHECK(st1.kv.prefix_hits_pages > st0.kv.prefix_hits_pages);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(got[i].n, 20);
        engine_req_release(rs[i]);
    }
    CHECK_MEM_EQ(got[1].toks, one.toks, sizeof(int32_t) * 20); // choice 1: seed 99 + 1
    check_clean(e);
    free(ids);
    engine_destroy(e);
    model_free(g_model);
    g_model = kjv;
    unlink(path);
    rmdir(dir);
}

int main(void) {
    g_model = kjv_model_load(true);
    if (!g_model) return 1;
    test_bias_sampler();
    test_prompt_logprobs();
    test_n_choices();
    test_n_choices_hybrid();
    model_free(g_model);
    printf("engine choices ok\n");
    return 0;
}
