/* test_engine_spec.c — speculative decoding (engine_opts.spec_tokens) on
 * the shipped kjv-mini model. Each case runs the same requests on an
 * engine without speculation and on one with it, and asks:
 * - greedy: the same tokens, token for token, and drafts were computed and
 *   kept (a verify that keeps a draft its draw did not confirm, or that
 *   reads a rejected draft's K/V, changes the tokens);
 * - sampled: for 24 seeds the same tokens as without speculation (one draw
 *   per token, from the same rows: the distribution is the same because
 *   every seed's draws are);
 * - a prediction (OpenAI's predicted outputs) equal to the output: every
 *   draft kept; a wrong one: nothing kept, the same tokens;
 * - stop strings and max_tokens ending a request in the middle of its kept
 *   drafts; the per-request opt-out; several requests at once (batch
 *   invariance with drafts in the batch); spec_max_batch: no drafts in a
 *   batch over it;
 * - a draft model, and the NextN block of a glm4moe file (test_nextn);
 * - every page back and scrubbed at the end (check_clean). */
#include "kvseal/engine.h"

#include "../check.h"
#include "engine_fixture.h"
#include "gguf_patch.h"

#include <stdlib.h>

typedef struct {
    int32_t toks[256];
    int n;
    engine_event done;
} result;

static engine *make_engine(int spec_tokens, int max_batch) {
    engine_opts o = efx_opts(512, 256, 8, false);
    o.spec_tokens = spec_tokens;
    if (max_batch) o.spec_max_batch = max_batch;
    return efx_engine(&o);
}

static void collect(engine_req *r, result *res) {
    memset(res, 0, sizeof *res);
    for (;;) {
        engine_event ev;
        CHECK_EQ(engine_req_next(r, &ev, 60000), KS_OK);
        if (ev.token >= 0) {
            CHECK(res->n < 256);
            res->toks[res->n++] = ev.token;
        }
        if (ev.done) {
            res->done = ev;
            return;
        }
    }
}

static void params(engine_params *p, const int32_t *ids, size_t n, int max_tokens, float temp,
                   uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->tenant = "t";
    p->prompt = ids;
    p->n_prompt = (int32_t)n;
    p->max_tokens = max_tokens;
    sample_params_default(&p->sp);
    p->sp.temperature = temp;
    p->sp.seed = seed;
}

static void run(engine *e, const engine_params *p, result *res) {
    engine_req *r;
    ks_errbuf eb;
    CHECK_EQ(engine_submit(e, p, &r, &eb), KS_OK);
    collect(r, res);
    engine_req_release(r);
    CHECK_EQ(res->done.state, ENGINE_FINISHED);
}

static void check_same(const result *a, const result *b) {
    CHECK_EQ(a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++)
        CHECK_EQ(a->toks[i], b->toks[i]);
    CHECK_EQ(a->done.finish, b->done.finish);
    CHECK_EQ(a->done.n_gen, b->done.n_gen);
}

// a passage the model knows, twice: its second half repeats the first, so
// the last tokens' earlier occurrence predicts what follows (prompt lookup)
static const char *const QUOTE =
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
    "of the waters. In the beginning God created the heaven and the earth. And the earth";

static engine *g_off, *g_on;

static void test_greedy(void) {
    int32_t *ids;
    size_t n;
    tokenize(QUOTE, &ids, &n);
    engine_params p;
    params(&p, ids, n, 96, 0.0f, 1);
    p.ignore_eos = true;
    result a, b;
    run(g_off, &p, &a);
    run(g_on, &p, &b);
    check_same(&a, &b);
    CHECK_EQ(a.done.n_drafted, 0);
    printf("  greedy: %d tokens, %d drafted, %d kept\n", b.n, b.done.n_drafted,
           b.done.n_accepted);
    CHECK(b.done.n_drafted > 0);
    CHECK(b.done.n_accepted > 0 && b.done.n_accepted <= b.done.n_drafted);
    // opted out: no drafts, the same tokens
    p.no_spec = true;
    run(g_on, &p, &b);
    check_same(&a, &b);
    CHECK_EQ(b.done.n_drafted, 0);
    free(ids);
}

static void test_sampled(void) {
    int32_t *ids;
    size_t n;
    tokenize(QUOTE, &ids, &n);
    int drafted = 0, kept = 0;
    for (uint64_t seed = 1; seed <= 24; seed++) {
        engine_params p;
        params(&p, ids, n, 48, 0.7f, seed * 7919);
        p.sp.repeat_penalty = seed % 2 ? 1.0f : 1.1f; // the penalty history moves with each token
        result a, b;
        run(g_off, &p, &a);
        run(g_on, &p, &b);
        check_same(&a, &b);
        drafted += b.done.n_drafted;
        kept += b.done.n_accepted;
    }
    printf("  sampled: 24 seeds, %d drafted, %d kept\n", drafted, kept);
    CHECK(kept > 0);
    free(ids);
}

static void test_prediction(void) {
    int32_t *ids;
    size_t n;
    tokenize("And God said, Let there be light:", &ids, &n);
    engine_params p;
    params(&p, ids, n, 64, 0.0f, 1);
    p.ignore_eos = true;
    result a, b;
    run(g_off, &p, &a);
    // the output itself as the prediction: every draft is kept
    p.prediction = a.toks;
    p.n_prediction = a.n;
    run(g_on, &p, &b);
    check_same(&a, &b);
    printf("  prediction: %d tokens, %d drafted, %d kept\n", b.n, b.done.n_drafted,
           b.done.n_accepted);
    CHECK_EQ(b.done.n_accepted, b.done.n_drafted);
    CHECK(b.done.n_drafted >= a.n / 2);
    // a wrong prediction (the output shifted by one id): the same tokens
    int32_t wrong[256];
    for (int i = 0; i < a.n; i++)
        wrong[i] = (a.toks[i] + 1) % model_hp(g_model)->n_vocab;
    p.prediction = wrong;
    run(g_on, &p, &b);
    check_same(&a, &b);
    // max_tokens inside a run of kept drafts: exactly max_tokens
    p.prediction = a.toks;
    p.max_tokens = 7;
    run(g_on, &p, &b);
    CHECK_EQ(b.n, 7);
    for (int i = 0; i < 7; i++)
        CHECK_EQ(b.toks[i], a.toks[i]);
    free(ids);
}

/* A stop string that matches inside a run of kept drafts ends the request
 * there, as without speculation (the same tokens, text and finish). */
static void test_stop(void) {
    int32_t *ids;
    size_t n;
    tokenize(QUOTE, &ids, &n);
    engine_params p;
    params(&p, ids, n, 96, 0.0f, 1);
    p.ignore_eos = true;
    result a, b;
    run(g_off, &p, &a);
    // the stop string: the text of a word-like token well into the output
    char stop[64] = "";
    for (int i = 12; i < a.n && strlen(stop) < 4; i++) {
        size_t k = tok_piece(model_vocab(g_model), a.toks[i], false, stop, sizeof stop - 1);
        stop[k < sizeof stop - 1 ? k : 0] = '\0';
    }
    CHECK(strlen(stop) >= 4);
    const char *stops[] = {stop};
    p.stops = stops;
    p.n_stops = 1;
    run(g_off, &p, &a);
    run(g_on, &p, &b);
    check_same(&a, &b);
    CHECK(a.n < 96);
    CHECK_EQ(b.done.finish, ENGINE_FINISH_STOP);
    free(ids);
}

/* Several requests at once, some drafting, one opted out, on an engine
 * whose batch limit lets up to 4 draft: each gets its solo tokens. Then a
 * limit of 1: with three decoding together nobody drafts. */
static void test_batch(void) {
    const char *prompts[] = {QUOTE, "And God said, Let there be light:",
                                    "The LORD is my shepherd; I shall not want.", QUOTE};
    int32_t *ids[4];
    size_t n[4];
    engine_params p[4];
    result solo[4], got[4];
    for (int i = 0; i < 4; i++) {
        tokenize(prompts[i], &ids[i], &n[i]);
        params(&p[i], ids[i], n[i], 40, i == 2 ? 0.8f : 0.0f, 100 + (uint64_t)i);
        p[i].ignore_eos = true;
        p[i].no_spec = i == 3;
        run(g_off, &p[i], &solo[i]);
    }
    engine_req *r[4];
    ks_errbuf eb;
    for (int i = 0; i < 4; i++)
        CHECK_EQ(engine_submit(g_on, &p[i], &r[i], &eb), KS_OK);
    for (int i = 0; i < 4; i++) {
        collect(r[i], &got[i]);
        engine_req_release(r[i]);
        check_same(&solo[i], &got[i]);
    }
    CHECK_EQ(got[3].done.n_drafted, 0);
    // limit 1: the three choices of an n=3 request decode together and draft
    // nothing; choice 0, a step ahead of the others once (it samples while
    // they compute their last prompt page), may draft in that one step
    // (24 tokens: under ENGINE_STREAM_BACKLOG, so no choice sits steps out
    // unread while this thread reads another, and then decodes alone)
    engine *e1 = make_engine(4, 1);
    engine_req *c[3];
    p[0].max_tokens = 24;
    CHECK_EQ(engine_submit_n(e1, &p[0], 3, c, &eb), KS_OK);
    for (int i = 0; i < 3; i++) {
        collect(c[i], &got[i]);
        engine_req_release(c[i]);
        CHECK(got[i].done.n_drafted <= (i == 0 ? 4 : 0));
    }
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(got[i].n, 24);
        for (int j = 0; j < 24; j++)
            CHECK_EQ(got[i].toks[j], solo[0].toks[j]);
    }
    check_clean(e1);
    engine_destroy(e1);
    for (int i = 0; i < 4; i++)
        free(ids[i]);
}

/* The model as its own draft model (engine_opts.draft): its greedy drafts
 * are the model's own greedy tokens, so with greedy sampling every draft
 * is kept (a draft KV that falls out of step with the request's tokens, a
 * wrong rollback after a rejection or a catch-up that skips a token shows
 * as a rejected draft); sampled, the same tokens as without speculation.
 * Its pages are in a pool of its own, back and scrubbed at the end. */
static void test_draft_model(void) {
    engine_opts o = efx_opts(512, 256, 8, false);
    o.spec_tokens = 4;
    o.draft = g_model;
    o.max_batch_tokens = 32; // a longer prompt takes the draft model two steps to catch up
    engine *e = efx_engine(&o);
    int32_t *ids;
    size_t n;
    tokenize(QUOTE, &ids, &n);
    engine_params p;
    params(&p, ids, n, 80, 0.0f, 1);
    p.ignore_eos = true;
    result a, b;
    run(g_off, &p, &a);
    run(e, &p, &b);
    check_same(&a, &b);
    printf("  draft model, greedy: %d tokens, %d drafted, %d kept\n", b.n, b.done.n_drafted,
           b.done.n_accepted);
    CHECK(b.done.n_drafted >= 40);
    CHECK_EQ(b.done.n_accepted, b.done.n_drafted);
    int drafted = 0, kept = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        params(&p, ids, n, 40, 0.9f, seed);
        run(g_off, &p, &a);
        run(e, &p, &b);
        check_same(&a, &b);
        drafted += b.done.n_drafted;
        kept += b.done.n_accepted;
    }
    printf("  draft model, sampled: 8 seeds, %d drafted, %d kept\n", drafted, kept);
    CHECK(kept > 0 && kept < drafted); // sampled tokens leave the greedy drafts sometimes
    check_clean(e);
    engine_destroy(e);
    free(ids);
}

/* An engine over m drafting with its NextN block (spec_nextn). */
static engine *nextn_engine(const model *m, bool nextn, int max_batch_tokens, bool prefix) {
    engine_opts o = efx_opts(512, 256, 8, prefix);
    o.m = m;
    o.spec_tokens = nextn ? 4 : 0;
    o.spec_nextn = nextn;
    o.max_batch_tokens = max_batch_tokens;
    return efx_engine(&o);
}

/* NextN drafting (engine_opts.spec_nextn) on glm4moe `kvseal mkmodel`
 * files (blk.3 the NextN block; gguf_patch.h):
 * - random weights: greedy and seeded sampled tokens as without
 *   speculation, drafts computed, and fewer once single drafts are lost
 *   (rests); the same drafts kept whether the prompt
 *   is computed in one step or in chunks of 8 (the head reads, at each
 *   position, that position's hidden row and the token after it, whichever
 *   step computed it);
 * - a model whose layers add nothing (its next token: the one whose output
 *   row best matches the last token's normed embedding) and a NextN probe
 *   passing the embedding of its token through: the head predicts the
 *   model's token after next exactly, so every draft is kept, also with a
 *   prompt computed in chunks and after a cached prefix (slots start past
 *   it). A head fed the wrong token, or a chain fed the wrong draft, loses
 *   drafts;
 * - the pass-through model with a NextN probe passing the hidden row
 *   through: the head repeats the model's token at that row's position, so
 *   the drafts kept are exactly the output's repeats (a row from another
 *   position keeps others).
 * Pages of the head's pool back and scrubbed at the end (check_clean). */
static void test_nextn(void) {
    char dst[256];
    snprintf(dst, sizeof dst, "/tmp/ks_test_nextn_%d.gguf", (int)getpid());
    if (!gp_mkmodel(dst, "--arch glm4moe --seed 12")) return;
    ks_errbuf eb;
    model *m;
    CHECK_EQ(model_load(dst, &m, &eb), KS_OK);
    int32_t *ids;
    size_t n;
    tokenize(QUOTE, &ids, &n);
    engine_params p;
    result a, b, c;
    engine *off = nextn_engine(m, false, 64, false), *on = nextn_engine(m, true, 64, false);
    engine *chunked = nextn_engine(m, true, 8, false);
    params(&p, ids, n, 40, 0.0f, 1);
    p.ignore_eos = true;
    run(off, &p, &a);
    run(on, &p, &b);
    run(chunked, &p, &c);
    check_same(&a, &b);
    check_same(&a, &c);
    printf("  NextN, random weights, greedy: %d drafted, %d kept (chunked prompt: %d, %d)\n",
           b.done.n_drafted, b.done.n_accepted, c.done.n_drafted, c.done.n_accepted);
    // next to nothing kept: 4, 2, 1 drafts, then single drafts after rests of
    // 2, 4, 8, .. steps (engine__spec_adapt; a draft every step: 42)
    CHECK(b.done.n_drafted > 0 && b.done.n_drafted <= 16);
    CHECK_EQ(b.done.n_drafted, c.done.n_drafted);
    CHECK_EQ(b.done.n_accepted, c.done.n_accepted);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        params(&p, ids, n, 24, 0.9f, seed);
        run(off, &p, &a);
        run(on, &p, &b);
        check_same(&a, &b);
    }
    check_clean(on);
    check_clean(chunked);
    engine_destroy(on);
    engine_destroy(chunked);
    engine_destroy(off);
    model_free(m);
    // the counting model: its layers add nothing and output row v is token
    // v - 1's embedding, so its greedy tokens count up by one. Its NextN
    // block, from a file with the block's own output matrix, as a probe
    gp_mkmodel(dst, "--arch glm4moe --seed 12 --nextn-head");
    for (int l = 0; l < 3; l++) gp_silence_glm4moe_block(dst, l, l == 0);
    gp_fill(dst, "output_norm.weight", 1.0f, -1);
    gp_rows_shifted(dst, "output.weight", "token_embd.weight", 1);
    for (int probe = 0; probe < 2; probe++) {
        // embedding probe, the head's output as the model's: it predicts its
        // token + 1, the token after next (each draft feeds the next slot);
        // hidden probe, its output counting by two: it predicts the token
        // at its hidden row's position + 2, the token after next again for
        // draft 1, and for further drafts the same token (they read the
        // head's own row, not a new hidden state): one kept a step
        const bool embd = probe == 0;
        gp_nextn_probe(dst, 3, 256, embd);
        gp_rows_shifted(dst, "blk.3.nextn.shared_head_head.weight", "token_embd.weight",
                        embd ? 1 : 2);
        CHECK_EQ(model_load(dst, &m, &eb), KS_OK);
        off = nextn_engine(m, false, 64, false);
        on = nextn_engine(m, true, 8, true); // prompts in chunks of 8, prefix cache
        params(&p, ids, n, 48, 0.0f, 1);
        p.ignore_eos = true;
        run(off, &p, &a);
        for (int i = 1; i < a.n; i++) CHECK_EQ(a.toks[i], (a.toks[i - 1] + 1) % 2048);
        for (int k = 0; k < 2; k++) { // the second time its prompt pages come from the cache
            run(on, &p, &b);
            check_same(&a, &b);
            // the drafts as the head should make them: from `last` = toks[i],
            // the token after it at position L - 2 (toks[i - 1], or the prompt's)
            int drafted = 0, kept = 0;
            for (int i = 0, kk = 4, rest = 0, rest_len = 0; i + 1 < b.n;) {
                int want = p.max_tokens - (i + 1) - 1, kp = 0;
                if (want > kk) want = kk;
                if (want <= 0) break;
                if (rest > 0) { // a step without drafts (engine__spec_adapt's rest)
                    rest--, i++;
                    continue;
                }
                const int32_t prev = i > 0 ? b.toks[i - 1] : ids[n - 1];
                for (int d = 0; d < want && i + 1 + d < b.n; d++, kp++) {
                    const int32_t draft = embd ? (b.toks[i] + 1 + d) % 2048 : (prev + 2) % 2048;
                    if (b.toks[i + 1 + d] != draft) break;
                }
                drafted += want, kept += kp;
                kk = kp == want ? (2 * kk > 4 ? 4 : 2 * kk) : kp == 0 ? (kk / 2 > 1 ? kk / 2 : 1) : kk;
                if (kp > 0) rest_len = 0;
                else if (want == 1) rest = rest_len = rest_len ? (2 * rest_len > 32 ? 32 : 2 * rest_len) : 2;
                i += kp + 1;
            }
            printf("  NextN %s probe: %d tokens, %d cached, %d drafted, %d kept (expected %d, %d)\n",
                   embd ? "embedding" : "hidden", b.n, b.done.n_cached, b.done.n_drafted,
                   b.done.n_accepted, drafted, kept);
            CHECK(k == 0 ? b.done.n_cached == 0 : b.done.n_cached >= 16);
            CHECK_EQ(b.done.n_drafted, drafted);
            CHECK_EQ(b.done.n_accepted, kept);
            CHECK(kept >= (embd ? 32 : 8));
        }
        check_clean(on);
        engine_destroy(off);
        engine_destroy(on);
        model_free(m);
    }
    free(ids);
    unlink(dst);
}

int main(void) {
    ks_log_set_level(KS_LOG_WARN);
    g_model = kjv_model_load(true);
    CHECK(g_model != NULL);
    g_off = make_engine(0, 0);
    g_on = make_engine(4, 0);
    test_greedy();
    test_sampled();
    test_prediction();
    test_stop();
    test_batch();
    test_draft_model();
    test_nextn();
    engine_stats st;
    engine_get_stats(g_on, &st);
    printf("  engine: %llu verify steps, %llu drafted, %llu kept\n",
           (unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
           (unsigned long long)st.spec_accepted);
    CHECK(st.spec_drafted > 0 && st.spec_accepted > 0 && st.spec_accepted <= st.spec_drafted);
    check_clean(g_off);
    check_clean(g_on);
    engine_destroy(g_off);
    engine_destroy(g_on);
    model_free(g_model);
    printf("engine_spec ok\n");
    return 0;
}
