/* engine_fixture.h — what the engine's unit tests on the shipped model
 * share (test_engine_sched.c, test_engine_choices.c, test_engine_adopt.c):
 * the model, engine options and creation, tokenizing a prompt, and the
 * final check that every page came back. Header-only (static inline); the
 * including test's main sets g_model (kjv_model_load(true)). */
#ifndef KS_TESTS_ENGINE_FIXTURE_H
#define KS_TESTS_ENGINE_FIXTURE_H

#include "../check.h"
#include "kjv_model.h"
#include "kvseal/engine.h"

static model *g_model; // the shipped model, loaded once by main

/* Options for an engine on g_model: two threads, 64-token batches, a
 * context of n_ctx, pages KV pages, max_running sequences in a batch, the
 * prefix cache on or off; the rest engine_opts_default's. */
static inline engine_opts efx_opts(int32_t n_ctx, uint32_t pages, int max_running, bool prefix) {
    engine_opts o;
    engine_opts_default(&o);
    o.m = g_model;
    o.n_threads = 2;
    o.n_ctx = n_ctx;
    o.kv_pages = pages;
    o.max_running = max_running;
    o.max_batch_tokens = 64;
    o.prefix_cache = prefix;
    return o;
}

/* The engine of o; the test fails with engine_create's message if it cannot start. */
static inline engine *efx_engine(const engine_opts *o) {
    engine *e;
    ks_errbuf eb;
    if (engine_create(o, &e, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        CHECK(0);
    }
    return e;
}

/* text in g_model's tokens, BOS first; *ids is the caller's to free. */
static inline void tokenize(const char *text, int32_t **ids, size_t *n) {
    ks_errbuf eb;
    CHECK_EQ(tok_encode(model_vocab(g_model), text, strlen(text), true, false, ids, n, &eb), KS_OK);
}

/* Every page of e is FREE and scrubbed again (within 30 s). */
static inline void check_clean(engine *e) {
    ks_errbuf eb;
    ks_err err = engine_check_quiescent(e, 30000, &eb);
    if (err) fprintf(stderr, "%s\n", eb.msg);
    CHECK_EQ(err, KS_OK);
}

#endif
