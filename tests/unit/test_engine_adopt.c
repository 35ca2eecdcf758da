/* test_engine_adopt.c — the decode-worker side of the engine on the shipped
 * kjv-mini model: engine_opts.poll / poll_end and engine_adopt.
 *
 * The poll hook plays the decode worker: on the scheduler thread it prefills
 * a prompt itself into a kv_seq of engine_pool(e) (its own model_ctx on that
 * pool), samples the first token with a fresh sampler as a prefill worker
 * does, and adopts the request. Every token event (and its logprobs) must
 * equal what engine_submit of the same request gives on a second, ordinary
 * engine: greedy, and sampled at temperature 0.8 with seeds and n_probs 3
 * (which fails if the sampler does not continue from rng_draws, or if the
 * step decodes at the wrong position). Also: a first token that is EOS
 * finishes at once with n_gen 0; max_tokens 1; cancel; AGAIN when the batch
 * is full or the model offline; INVAL on bad arguments; the engine never
 * releases the borrowed sequence (the hook checks its pages after the done
 * event, frees it and finds the pool all free and scrubbed); poll runs on
 * one thread and poll_end exactly once, last; engine_adopt outside poll is a
 * programmer error (asserted). */
#include "kvseal/admit.h"
#include "kvseal/engine.h"
#include "kvseal/kern.h"

#include "../check.h"
#include "engine_fixture.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_CTX 512

static int32_t g_V;

// ----------------------------------------------------------------------------
// The hook: a minimal decode worker

/* One request for the hook to prefill and adopt (test thread -> hook). */
typedef struct job {
    const int32_t *prompt; // (n_prompt)
    int32_t n_prompt, max_tokens;
    uint32_t reserve;      // positions to reserve (0: n_prompt + max_tokens)
    sample_params sp;
    bool ignore_eos;
    int32_t force_first;   // >= 0: adopt with this first token instead of the sampled one
    bool cancel_in_hook;   // cancel right after adopting (the scheduler thread)
    bool bad_sp;           // adopt with top_p 0 (invalid)
    bool huge_draws;       // adopt with an absurd rng_draws
    struct job *second;    // adopt this one too, in the same poll call
    // results (hook -> test)
    ks_err err;
    char errmsg[KS_ERRMSG_CAP];
    uint16_t reason; /* the refusal's admit_reason */
    engine_req *req;
    kv_seq seq;            // borrowed by the engine while req runs
    bool has_seq;
    sample_result first;
} job;

typedef struct hook {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *pending;          // test -> hook: prefill and adopt
    job *to_release;       // test -> hook: check the sequence, release it, check the pool
    bool answered;         // hook -> test: the command above is done
    bool seq_intact, pool_clean;
    // scheduler-owned
    model_ctx *mc;
    float *logits;         // (n_vocab)
    pthread_t tid;
    int n_poll, n_poll_end, n_poll_after_end, n_wrong_thread;
} hook;

static void hook_thread(hook *h) {
    if (h->n_poll + h->n_poll_end == 0) h->tid = pthread_self();
    else if (!pthread_equal(h->tid, pthread_self())) h->n_wrong_thread++;
}

/* Prefills j's prompt into a fresh sequence of the engine's pool, samples
 * the first token as a prefill worker does, adopts. */
static void hook_adopt(hook *h, engine *e, job *j) {
    kv_pool *pool = engine_pool(e);
    ks_errbuf eb;
    if (!h->mc) {
        CHECK_EQ(model_ctx_create(g_model, pool, 2, 256, N_CTX, &h->mc, &eb), KS_OK);
        h->logits = malloc(sizeof(float) * (size_t)g_V);
        CHECK(h->logits);
    }
    kv_seq_init(pool, &j->seq);
    j->has_seq = true;
    uint32_t reserve = j->reserve ? j->reserve : (uint32_t)(j->n_prompt + j->max_tokens);
    CHECK_EQ(kv_seq_reserve(pool, &j->seq, reserve, &eb), KS_OK);
    int32_t n = j->n_prompt, pos[256], sq[256], out[256];
    CHECK(n <= 256);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = i;
        sq[i] = 0;
        out[i] = i == n - 1 ? 0 : -1;
    }
    kv_seq *seqs[1] = {&j->seq};
    model_batch b = {.n_tokens = n, .tokens = j->prompt, .pos = pos, .seq = sq, .out_row = out,
                     .n_out = 1, .n_seqs = 1, .seqs = seqs, .seq_err = NULL};
    CHECK_EQ(model_forward(h->mc, &b, h->logits, &eb), KS_OK);
    kv_seq_set_filled(pool, &j->seq, (uint32_t)n);
    sampler *smp;
    CHECK_EQ(sampler_create(&j->sp, g_V, &smp, &eb), KS_OK);
    sampler_sample(smp, h->logits, &j->first);
    uint64_t draws = sampler_draws(smp);
    sampler_destroy(smp);
    if (j->force_first >= 0) j->first.token = j->force_first;
    engine_adopt_args a = {.tenant = "t1", .n_prompt = j->n_prompt, .max_tokens = j->max_tokens,
                           .sp = j->sp, .ignore_eos = j->ignore_eos, .seq = &j->seq,
                           .first = j->first, .rng_draws = draws};
    if (j->bad_sp) a.sp.top_p = 0.0f;
    if (j->huge_draws) a.rng_draws = UINT64_MAX / 2;
    ks_errbuf_clear(&eb);
    j->err = engine_adopt(e, &a, &j->req, &eb);
    snprintf(j->errmsg, sizeof j->errmsg, "%s", eb.msg);
    j->reason = j->err ? eb.reason : 0;
    if (j->err) {  // refused: nothing refers to the sequence; the worker frees it
        CHECK(!j->req);
        kv_seq_release(pool, &j->seq);
        j->has_seq = false;
    } else if (j->cancel_in_hook) {
        engine_req_cancel(j->req);
    }
}

/* After the done event: the engine must not have released the borrowed
 * sequence. Then the worker frees it; nothing else holds pages. */
static void hook_release(hook *h, engine *e, job *j) {
    kv_pool *pool = engine_pool(e);
    bool intact = j->has_seq && j->seq.n_pages > 0;
    for (uint32_t i = 0; intact && i < j->seq.n_pages; i++) {
        kv_entry en = kv_seq_entry(&j->seq, i);
        kv_page_info pi;
        intact = kv_pool_page_info(pool, en.page, &pi) == KS_OK && pi.tag.seq_uid == j->seq.uid &&
                 pi.tag.gen == en.tag.gen &&
                 (pi.state == KV_PAGE_READY || pi.state == KV_PAGE_ALLOCATED) && pi.refcount == 1;
    }
    h->seq_intact = intact;
    if (j->has_seq) kv_seq_release(pool, &j->seq);
    j->has_seq = false;
    h->pool_clean = kv_pool_all_free_and_scrubbed(pool);
}

static void on_poll(void *ctx, engine *e, int timeout_ms) {
    hook *h = ctx;
    hook_thread(h);
    h->n_poll++;
    if (h->n_poll_end) h->n_poll_after_end++;
    CHECK(timeout_ms == 0 || timeout_ms == 50);
    pthread_mutex_lock(&h->mu);
    if (!h->pending && !h->to_release && timeout_ms > 0) {  // our "epoll": wait for commands
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += timeout_ms * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    job *j = h->pending, *rel = h->to_release;
    h->pending = h->to_release = NULL;
    pthread_mutex_unlock(&h->mu);
    if (j) {
        hook_adopt(h, e, j);
        if (j->second) hook_adopt(h, e, j->second);
    }
    if (rel) hook_release(h, e, rel);
    if (j || rel) {
        pthread_mutex_lock(&h->mu);
        h->answered = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
}

static void on_poll_end(void *ctx, engine *e) {
    hook *h = ctx;
    hook_thread(h);
    h->n_poll_end++;
    (void)engine_pool(e);  // allowed here too
    model_ctx_free(h->mc);
    free(h->logits);
    h->mc = NULL;
    h->logits = NULL;
}

/* Hands a command to the hook and waits until it ran. */
static void hook_cmd(hook *h, job *adopt, job *release) {
    pthread_mutex_lock(&h->mu);
    h->answered = false;
    h->pending = adopt;
    h->to_release = release;
    pthread_cond_broadcast(&h->cv);
    while (!h->answered) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

// ----------------------------------------------------------------------------
// Engines and results

static engine *make_engine(hook *h) {
    engine_opts o =
        efx_opts(N_CTX, 96, 1, false); // max_running 1: a second adoption meets a full batch
    if (h) {
        o.poll = on_poll;
        o.poll_end = on_poll_end;
        o.poll_ctx = h;
    }
    return efx_engine(&o);
}

typedef struct result {
    engine_event ev[600];  // token events, in order
    int n;
    char text[8192];
    size_t text_len;
    engine_event done;
} result;

static void collect(engine_req *r, result *res) {
    memset(res, 0, sizeof *res);
    for (;;) {
        engine_event ev;
        CHECK_EQ(engine_req_next(r, &ev, 60000), KS_OK);
        if (ev.token >= 0) {
            CHECK(res->n < 600);
            res->ev[res->n++] = ev;
        }
        CHECK(res->text_len + ev.text_len < sizeof res->text);
        memcpy(res->text + res->text_len, ev.text, ev.text_len);
        res->text_len += ev.text_len;
        if (ev.done) {
            res->done = ev;
            return;
        }
    }
}

static job make_job(const int32_t *ids, size_t n, int32_t max_tokens, const sample_params *sp,
                    bool ignore_eos) {
    job j;
    memset(&j, 0, sizeof j);
    j.prompt = ids;
    j.n_prompt = (int32_t)n;
    j.max_tokens = max_tokens;
    j.sp = *sp;
    j.ignore_eos = ignore_eos;
    j.force_first = -1;
    return j;
}

/* The same request through engine_submit on the ordinary engine. */
static void run_submit(engine *ref, const job *j, result *res) {
    engine_params p;
    memset(&p, 0, sizeof p);
    p.tenant = "t1";
    p.prompt = j->prompt;
    p.n_prompt = j->n_prompt;
    p.max_tokens = j->max_tokens;
    p.sp = j->sp;
    p.ignore_eos = j->ignore_eos;
    engine_req *r;
    ks_errbuf eb;
    CHECK_EQ(engine_submit(ref, &p, &r, &eb), KS_OK);
    collect(r, res);
    engine_req_release(r);
}

/* Releases j's sequence through the hook: it must still be intact, and the
 * pool then all free and scrubbed. */
static void release_checked(hook *h, job *j) {
    hook_cmd(h, NULL, j);
    CHECK(h->seq_intact);
    CHECK(h->pool_clean);
}

static void check_same(const result *a, const result *b) {
    CHECK_EQ(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        const engine_event *x = &a->ev[i], *y = &b->ev[i];
        CHECK_EQ(x->token, y->token);
        CHECK_MEM_EQ(&x->sr.logprob, &y->sr.logprob, sizeof(float));  // bit-exact
        CHECK_EQ(x->sr.n_top, y->sr.n_top);
        for (int k = 0; k < x->sr.n_top; k++) {
            CHECK_EQ(x->sr.top_ids[k], y->sr.top_ids[k]);
            CHECK_MEM_EQ(&x->sr.top_logprobs[k], &y->sr.top_logprobs[k], sizeof(float));
        }
    }
    CHECK_EQ(a->text_len, b->text_len);
    CHECK_MEM_EQ(a->text, b->text, a->text_len);
    CHECK_EQ(a->done.finish, b->done.finish);
    CHECK_EQ(a->done.state, b->done.state);
    CHECK_EQ(a->done.err, b->done.err);
    CHECK_EQ(a->done.n_gen, b->done.n_gen);
    CHECK_EQ(a->done.n_prompt, b->done.n_prompt);
}

/* Adopts j through the hook, which must accept it, and collects its
 * answer into *res; the request is released, the sequence still the hook's. */
static void adopt_collect(hook *h, job *j, result *res) {
    hook_cmd(h, j, NULL);
    if (j->err) fprintf(stderr, "engine_adopt: %s\n", j->errmsg);
    CHECK_EQ(j->err, KS_OK);
    CHECK(j->req);
    collect(j->req, res);
    engine_req_release(j->req);
}

/* Greedy sampling: the default parameters at temperature 0. */
static sample_params greedy_sp(void) {
    sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0;
    return sp;
}

/* Adopts j (through h's engine), collects it, compares with engine_submit on
 * ref, frees the sequence. Returns the adopted result in *out. */
static void adopt_vs_submit(hook *h, engine *ref, job *j, result *out) {
    static result sub;
    adopt_collect(h, j, out);
    release_checked(h, j);
    run_submit(ref, j, &sub);
    check_same(out, &sub);
}

// ----------------------------------------------------------------------------
// Tests

static const char *PROMPT = "In the beginning God created the heaven and the earth.";

static void test_greedy_and_sampled(hook *h, engine *ref) {
    int32_t *ids;
    size_t n;
    tokenize(PROMPT, &ids, &n);
    static result res, greedy;
    sample_params sp = greedy_sp();
    job j = make_job(ids, n, 24, &sp, false);
    adopt_vs_submit(h, ref, &j, &greedy);
    CHECK(greedy.n >= 2);
    CHECK_EQ(greedy.done.n_prompt, (int32_t)n);
    CHECK_EQ(greedy.ev[0].token, j.first.token);  // the first event is the prefill side's token

    // sampled: the decode side's draws must continue the prefill side's
    int differs = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        sample_params_default(&sp);
        sp.temperature = 0.8f;
        sp.seed = seed * 7919;
        sp.n_probs = 3;
        sp.logprobs = true;
        j = make_job(ids, n, 24, &sp, true);
        adopt_vs_submit(h, ref, &j, &res);
        CHECK_EQ(res.n, 24);
        CHECK_EQ(res.done.finish, ENGINE_FINISH_LENGTH);
        CHECK_EQ(res.ev[0].sr.n_top, 3);
        CHECK(res.ev[0].sr.logprob < 0.0f);
        bool same = res.n == greedy.n;
        for (int i = 0; same && i < res.n; i++) same = res.ev[i].token == greedy.ev[i].token;
        differs += !same;
    }
    CHECK(differs > 0);  // sampling really sampled, so the draw count mattered
    free(ids);
}

static void test_first_eos_and_max1(hook *h, engine *ref) {
    int32_t *ids;
    size_t n;
    tokenize(PROMPT, &ids, &n);
    static result res;
    sample_params sp = greedy_sp();
    int32_t eos = tok_eos(model_vocab(g_model));
    CHECK(eos >= 0 && eos < g_V);

    // first token EOS: finished at once, nothing generated, no token event
    job j = make_job(ids, n, 8, &sp, false);
    j.force_first = eos;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_OK);
    CHECK_EQ(engine_req_state(j.req), ENGINE_FINISHED);
    collect(j.req, &res);
    engine_req_release(j.req);
    CHECK_EQ(res.n, 0);
    CHECK_EQ(res.text_len, 0);
    CHECK_EQ(res.done.finish, ENGINE_FINISH_STOP);
    CHECK_EQ(res.done.state, ENGINE_FINISHED);
    CHECK_EQ(res.done.err, KS_OK);
    CHECK_EQ(res.done.n_gen, 0);
    CHECK_EQ(res.done.n_prompt, (int32_t)n);
    release_checked(h, &j);

    // ... unless ignore_eos: then it is an ordinary first token
    j = make_job(ids, n, 3, &sp, true);
    j.force_first = eos;
    adopt_collect(h, &j, &res);
    CHECK_EQ(res.n, 3);
    CHECK_EQ(res.ev[0].token, eos);
    CHECK_EQ(res.done.n_gen, 3);
    CHECK_EQ(res.done.finish, ENGINE_FINISH_LENGTH);
    release_checked(h, &j);

    // max_tokens 1: the first token is the whole answer
    j = make_job(ids, n, 1, &sp, false);
    adopt_vs_submit(h, ref, &j, &res);
    CHECK_EQ(res.n, 1);
    CHECK_EQ(res.done.n_gen, 1);
    CHECK_EQ(res.done.finish, ENGINE_FINISH_LENGTH);
    free(ids);
}

static void test_cancel_and_again(hook *h, engine *e) {
    int32_t *ids;
    size_t n;
    tokenize(PROMPT, &ids, &n);
    static result res;
    sample_params sp = greedy_sp();
    // adopt a long request, and in the same poll a second one: the batch
    // (max_running 1) is full; then cancel the first before it decodes
    job j = make_job(ids, n, N_CTX - (int32_t)n, &sp, true);
    job j2 = make_job(ids, n, 4, &sp, false);
    j.second = &j2;
    j.cancel_in_hook = true;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_OK);
    CHECK_EQ(j2.err, KS_ERR_AGAIN);
    CHECK_STR_HAS(j2.errmsg, "batch full");
    CHECK(!j2.has_seq);
    collect(j.req, &res);
    engine_req_release(j.req);
    CHECK_EQ(res.n, 1);  // the first token was posted before the cancel
    CHECK_EQ(res.done.state, ENGINE_ABORTED);
    CHECK_EQ(res.done.finish, ENGINE_FINISH_ABORT);
    CHECK_EQ(res.done.err, KS_ERR_CANCELLED);
    CHECK_EQ(res.done.n_gen, 1);
    release_checked(h, &j);

    // a cancel from another thread, mid-generation
    j = make_job(ids, n, N_CTX - (int32_t)n, &sp, true);
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_OK);
    engine_event ev;
    CHECK_EQ(engine_req_next(j.req, &ev, 60000), KS_OK);
    CHECK(ev.token >= 0);
    engine_req_cancel(j.req);
    collect(j.req, &res);
    engine_req_release(j.req);
    CHECK_EQ(res.done.state, ENGINE_ABORTED);
    CHECK(res.done.n_gen < N_CTX - (int32_t)n);
    release_checked(h, &j);

    // offline: AGAIN; online again: accepted
    engine_set_online(e, false, false);
    j = make_job(ids, n, 4, &sp, false);
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_AGAIN);
    CHECK_STR_HAS(j.errmsg, "offline");
    engine_set_online(e, true, false);
    j = make_job(ids, n, 4, &sp, false);
    adopt_collect(h, &j, &res);
    CHECK_EQ(res.done.state, ENGINE_FINISHED);
    release_checked(h, &j);
    free(ids);
}

static void test_invalid(hook *h) {
    int32_t *ids;
    size_t n;
    tokenize(PROMPT, &ids, &n);
    sample_params sp = greedy_sp();
    job j = make_job(ids, n, 0, &sp, false);
    j.reserve = (uint32_t)n + 1;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INVAL);
    CHECK_EQ(j.reason, ADMIT_INVALID);
    CHECK_STR_HAS(j.errmsg, "max_tokens must be at least 1");

    j = make_job(ids, n, 4, &sp, false);
    j.force_first = g_V;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INTERNAL); // a decode worker's peer broke the protocol
    CHECK_EQ(j.reason, ADMIT_INTERNAL);
    CHECK_STR_HAS(j.errmsg, "out of range");

    j = make_job(ids, n, N_CTX, &sp, false);  // n + N_CTX > n_ctx
    j.reserve = (uint32_t)n + 16;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INVAL);
    CHECK_EQ(j.reason, ADMIT_CONTEXT_LENGTH);
    CHECK_STR_HAS(j.errmsg, "maximum context length is 512 tokens");

    j = make_job(ids, n, 64, &sp, false);  // the sequence lacks room for max_tokens
    j.reserve = (uint32_t)n + 1;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INTERNAL);
    CHECK_EQ(j.reason, ADMIT_INTERNAL);
    CHECK_STR_HAS(j.errmsg, "room for");

    j = make_job(ids, n, 4, &sp, false);
    j.bad_sp = true;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INVAL);
    CHECK_EQ(j.reason, ADMIT_INVALID);
    CHECK_STR_HAS(j.errmsg, "top_p must be in (0, 1]");

    j = make_job(ids, n, 4, &sp, false);  // replaying 2^63 draws would stall the scheduler
    j.huge_draws = true;
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_ERR_INTERNAL);
    CHECK_EQ(j.reason, ADMIT_INTERNAL);
    CHECK_STR_HAS(j.errmsg, "rng_draws");

    // nothing was adopted, and every refused sequence was freed by the hook
    j = make_job(ids, n, 4, &sp, false);
    hook_cmd(h, &j, NULL);
    CHECK_EQ(j.err, KS_OK);
    static result res;
    collect(j.req, &res);
    engine_req_release(j.req);
    release_checked(h, &j);
    free(ids);
}

/* engine_adopt outside the poll hook is a programmer error: it must abort,
 * not race the scheduler for the pool. Checked in a child process. */
static void test_adopt_outside_poll(engine *e) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        engine_adopt_args a;
        memset(&a, 0, sizeof a);
        engine_req *r;
        ks_errbuf eb;
        ks_err err = engine_adopt(e, &a, &r, &eb);
        _exit(err == KS_OK ? 0 : 1);  // not reached when the assertion holds
    }
    int st;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

int main(void) {
    g_model = kjv_model_load(true);
    if (!g_model) return 1;
    ks_errbuf eb;
    g_V = model_hp(g_model)->n_vocab;
    static hook h;
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    engine *e = make_engine(&h), *ref = make_engine(NULL);

    test_greedy_and_sampled(&h, ref);
    test_first_eos_and_max1(&h, ref);
    test_cancel_and_again(&h, e);
    test_invalid(&h);
    test_adopt_outside_poll(e);

    // engine_check_quiescent is still answered with the hook in place of the wait
    CHECK_EQ(engine_check_quiescent(e, 30000, &eb), KS_OK);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.tokens_in > 0 && st.n_rejected >= 6);
    CHECK_EQ(h.n_poll_end, 0);
    engine_destroy(e);
    CHECK(h.n_poll > 0); // after the scheduler thread, which counts them, has ended
    CHECK_EQ(h.n_poll_end, 1);       // exactly once, at shutdown
    CHECK_EQ(h.n_poll_after_end, 0); // and last
    CHECK_EQ(h.n_wrong_thread, 0);   // always the scheduler thread
    CHECK(!h.mc);
    engine_destroy(ref);
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.mu);
    model_free(g_model);
    printf("engine adopt ok\n");
    return 0;
}
