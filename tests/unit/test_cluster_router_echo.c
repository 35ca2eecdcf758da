/* test_cluster_router_echo.c — the router's side of echo with prompt
 * logprobs (PROMPT_LP, docs/pd-protocol.md section 4): a real router
 * (cluster_router_create, requests through its server backend) against
 * fake prefill and decode workers on pd_loops driven by this thread, which
 * script exactly which frame arrives when. Checks:
 *   - the merge: decode's first TOKEN arriving before any PROMPT_LP is held,
 *     so the client's events are position 0 (no logprob), every record in
 *     order with its values intact, then the generated tokens, then done;
 *     PREFILL carried PD_FLAG_PROMPT_LP and n_probs;
 *   - max_tokens 0: nothing generated is shown, the request ends FINISHED
 *     (length) at decode's first TOKEN, and decode gets ABORT STOP;
 *   - isolation: a PROMPT_LP for another prefill worker's request, or for a
 *     request id never issued, closes the sender's connection (ERROR PROTO)
 *     and nothing of it reaches any client; the request it named completes
 *     untouched from its own worker;
 *   - a record whose token is not the prompt's ends that request ABORTED
 *     with none of the message's records delivered;
 *   - the prefill worker lost after part of the records reached the client:
 *     the request is not started over elsewhere (the client has part of
 *     its answer) but ends ABORTED (peer closed) as other requests that
 *     lose a worker, and decode gets ABORT WORKER_LOST;
 *   - identities (issue 40, more than one router): every worker of one
 *     router gets its router identity in REGISTER_ACK, and request ids start
 *     at a random 64-bit value, not at the clock (two routers started a
 *     millisecond apart collided after 1000 requests).
 * Uses models/kjv-mini.gguf (KS_SRC). */
#include "cluster/cluster_int.h"

#include "../check.h"

#include <time.h>

static const uint8_t SECRET[32] = "cluster-secret-router-echo-01234";

#define PAGE_TOKENS 4
#define N_CTX 64

// ----------------------------------------------------------------------------
// Fake workers

typedef struct fake {
    uint8_t role;
    pd_loop *l;
    pd_conn *c;
    bool open, closed, registered;
    uint32_t id;
    uint64_t router_id; /* REGISTER_ACK's */
    // the last request frame of interest
    uint64_t admit_req, prefill_req, abort_req;
    int n_admit, n_prefill, n_abort, n_error;
    uint32_t abort_reason;
    pd_msg_sampling prefill_s; /* of the last PREFILL (pointers not kept) */
} fake;

typedef struct {
    model *m;
    kv_geom g;
    uint8_t model_id[32];
    cluster_router *r;
    server_backend b;
    fake dec, pre[4];
    int n_pre;
} harness;

static harness H;

static void send_frame(fake *f, uint16_t type, uint64_t req_id, const uint8_t *p, uint32_t len) {
    struct iovec iov = {(void *)p, len};
    CHECK(f->c);
    CHECK_EQ(pd_conn_send(f->c, type, req_id, &iov, len ? 1 : 0, NULL), KS_OK);
}

static void f_open(pd_conn *c, void *ud) {
    fake *f = ud;
    f->c = c;
    f->open = true;
    pd_msg_register m = {.role = f->role,
                         .kv_type = (uint8_t)H.g.kv_type,
                         .planes = (uint8_t)kv_geom_planes(&H.g),
                         .n_layer = (uint32_t)H.g.n_layer,
                         .kv_dim = (uint32_t)H.g.kv_dim,
                         .page_tokens = PAGE_TOKENS,
                         .n_pages = 256,
                         .n_ctx = N_CTX,
                         .data_port = f->role == PD_ROLE_DECODE ? 9 : 0,
                         .host = "127.0.0.1",
                         .host_len = f->role == PD_ROLE_DECODE ? 9 : 0};
    memcpy(m.model_id, H.model_id, 32);
    uint8_t buf[400];
    uint32_t n;
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, NULL), KS_OK);
    send_frame(f, PD_MSG_REGISTER, 0, buf, n);
}

static void f_frame(pd_conn *c, void *ud, const pd_frame *fr) {
    fake *f = ud;
    (void)c;
    uint8_t buf[600];
    uint32_t n;
    switch (fr->hdr.type) {
    case PD_MSG_REGISTER_ACK: {
        pd_msg_register_ack a;
        CHECK_EQ(pd_msg_register_ack_decode(fr->payload, fr->payload_len, &a, NULL), KS_OK);
        f->id = a.worker_id;
        f->router_id = a.router_id;
        f->registered = true;
        return;
    }
    case PD_MSG_HEALTH: {
        pd_msg_health h;
        CHECK_EQ(pd_msg_health_decode(fr->payload, fr->payload_len, &h, NULL), KS_OK);
        pd_msg_health_ack a = {.seq = h.seq, .free_pages = 256};
        CHECK_EQ(pd_msg_health_ack_encode(&a, buf, sizeof buf, &n, NULL), KS_OK);
        send_frame(f, PD_MSG_HEALTH_ACK, 0, buf, n);
        return;
    }
    case PD_MSG_ADMIT: { // grant at once: pages 0.. of a fake pool
        pd_msg_admit a;
        CHECK_EQ(pd_msg_admit_decode(fr->payload, fr->payload_len, &a, NULL), KS_OK);
        pd_msg_grant_entry en[N_CTX / PAGE_TOKENS];
        uint32_t np = (a.n_prompt + PAGE_TOKENS - 1) / PAGE_TOKENS;
        for (uint32_t i = 0; i < np; i++)
            en[i] = (pd_msg_grant_entry){.page_id = i,
                                         .first_token = i * PAGE_TOKENS,
                                         .n_tokens = a.n_prompt - i * PAGE_TOKENS < PAGE_TOKENS
                                                         ? a.n_prompt - i * PAGE_TOKENS
                                                         : PAGE_TOKENS,
                                         .gen = 1};
        pd_msg_grant g = {.seq_uid = 77,
                          .link_epoch = 5,
                          .n_prompt = a.n_prompt,
                          .page_tokens = PAGE_TOKENS,
                          .n_pages = np};
        CHECK_EQ(pd_msg_grant_encode(&g, en, buf, sizeof buf, &n, NULL), KS_OK);
        f->admit_req = fr->hdr.req_id;
        f->n_admit++;
        send_frame(f, PD_MSG_GRANT, fr->hdr.req_id, buf, n);
        return;
    }
    case PD_MSG_PREFILL: {
        pd_msg_prefill p;
        CHECK_EQ(pd_msg_prefill_decode(fr->payload, fr->payload_len, &p, NULL), KS_OK);
        f->prefill_req = fr->hdr.req_id;
        f->prefill_s = p.s;
        f->n_prefill++;
        return;
    }
    case PD_MSG_ABORT: {
        pd_msg_abort a;
        CHECK_EQ(pd_msg_abort_decode(fr->payload, fr->payload_len, &a, NULL), KS_OK);
        f->abort_req = fr->hdr.req_id;
        f->abort_reason = a.reason;
        f->n_abort++;
        return;
    }
    case PD_MSG_ERROR:
        f->n_error++;
        return;
    case PD_MSG_PEER:
    case PD_MSG_RETIRE:
        return;
    default:
        fprintf(stderr, "fake got %s\n", pd_msg_type_name(fr->hdr.type));
        CHECK(!"unexpected");
    }
}

static void f_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    fake *f = ud;
    (void)c;
    (void)why;
    (void)msg;
    f->c = NULL;
    f->closed = true;
}

static void pump(int ms) {
    uint64_t end = cl_now_ms(NULL) + (uint64_t)ms;
    do {
        CHECK_EQ(pd_loop_run_once(H.dec.l, 1), KS_OK);
        for (int i = 0; i < H.n_pre; i++)
            if (H.pre[i].l) CHECK_EQ(pd_loop_run_once(H.pre[i].l, 1), KS_OK);
    } while (cl_now_ms(NULL) < end);
}

/* Runs the fakes until *flag (an int or bool field, read as int) >= want. */
#define PUMP_UNTIL(cond)                                                                           \
    do {                                                                                           \
        uint64_t end_ = cl_now_ms(NULL) + TEST_WAIT_MS;                                            \
        while (!(cond) && cl_now_ms(NULL) < end_)                                                  \
            pump(1);                                                                               \
        CHECK(cond);                                                                               \
    } while (0)

static void fake_start(fake *f, uint8_t role, int port) {
    memset(f, 0, sizeof *f);
    f->role = role;
    pd_loop_cfg cfg = {.secret = SECRET,
                       .secret_len = sizeof SECRET,
                       .role = role,
                       .max_payload = PD_MSG_MAX_FRAME};
    CHECK_EQ(pd_loop_create(&cfg, &f->l, NULL), KS_OK);
    pd_conn_cbs cbs = {.on_open = f_open,
                       .on_frame = f_frame,
                       .on_close = f_close,
                       .peer_roles = 1u << PD_ROLE_ROUTER};
    pd_conn *c = NULL;
    CHECK_EQ(pd_tcp_connect(f->l, "127.0.0.1", (uint16_t)port, 2000, &cbs, f, &c, NULL), KS_OK);
    PUMP_UNTIL(f->registered);
}

// ----------------------------------------------------------------------------
// Requests and their events

typedef struct {
    void *req;
    engine_event ev[N_CTX + 8];
    int n;
    bool done;
} client;

static const int32_t PROMPT[4] = {1, 261, 422, 17};

static void submit(client *cl, int32_t max_tokens) {
    memset(cl, 0, sizeof *cl);
    engine_params p;
    memset(&p, 0, sizeof p);
    p.prompt = PROMPT;
    p.n_prompt = 4;
    p.max_tokens = max_tokens;
    sample_params_default(&p.sp);
    p.sp.temperature = 0.0f;
    p.sp.n_probs = 2;
    p.prompt_logprobs = true;
    p.prompt_top = 2;
    ks_errbuf eb;
    ks_err e = H.b.submit(H.b.impl, &p, &cl->req, &eb);
    if (e) fprintf(stderr, "submit: %s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
}

/* Takes every event available now. */
static void drain(client *cl) {
    engine_event ev;
    while (!cl->done && H.b.next(cl->req, &ev, 0) == KS_OK) {
        CHECK(cl->n < (int)(sizeof cl->ev / sizeof cl->ev[0]));
        cl->ev[cl->n++] = ev;
        cl->done = ev.done;
    }
}

static void wait_done(client *cl) {
    uint64_t end = cl_now_ms(NULL) + TEST_WAIT_MS;
    while (!cl->done && cl_now_ms(NULL) < end) {
        pump(1);
        drain(cl);
    }
    CHECK(cl->done);
}

/* The fake prefill worker that got req's PREFILL. */
static fake *owner(uint64_t req) {
    for (int i = 0; i < H.n_pre; i++)
        if (H.pre[i].c && H.pre[i].n_prefill && H.pre[i].prefill_req == req) return &H.pre[i];
    return NULL;
}

/* Records for positions first..first+n-1 of PROMPT (n_top 2), token of
 * position bad_pos replaced (0: none). */
static void send_lp(fake *f, uint64_t req, uint32_t first, uint32_t n, bool last,
                    uint32_t bad_pos) {
    int32_t t[4];
    float lp[4];
    pd_msg_top top[8];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pos = first + i;
        t[i] = pos == bad_pos ? 999 : PROMPT[pos];
        lp[i] = -0.125f * (float)pos;
        top[2 * i] = (pd_msg_top){.id = (int32_t)(100 + pos), .logprob = -0.0625f};
        top[2 * i + 1] = (pd_msg_top){.id = (int32_t)(200 + pos), .logprob = -3.0f};
    }
    pd_msg_prompt_lp m = {
        .first_pos = first, .n_records = n, .n_top = 2, .flags = last ? PD_PROMPT_LP_LAST : 0};
    uint8_t buf[256];
    uint32_t len;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, t, lp, top, buf, sizeof buf, &len, NULL), KS_OK);
    send_frame(f, PD_MSG_PROMPT_LP, req, buf, len);
}

static void send_token(uint64_t req, int32_t tok) {
    pd_msg_top top[2] = {{tok, -0.5f}, {3, -2.0f}};
    pd_msg_token t = {.token = tok, .logprob = -0.5f, .n_top = 2};
    uint8_t buf[64];
    uint32_t n;
    CHECK_EQ(pd_msg_token_encode(&t, top, buf, sizeof buf, &n, NULL), KS_OK);
    send_frame(&H.dec, PD_MSG_TOKEN, req, buf, n);
}

static void send_finish(uint64_t req, uint32_t n_gen) {
    pd_msg_finish f = {.finish = PD_FINISH_LENGTH, .n_prompt = 4, .n_gen = n_gen};
    uint8_t buf[64];
    uint32_t n;
    CHECK_EQ(pd_msg_finish_encode(&f, buf, sizeof buf, &n, NULL), KS_OK);
    send_frame(&H.dec, PD_MSG_FINISH, req, buf, n);
}

/* cl's events are the 4 prompt events (values as send_lp's), then the
 * generated tokens gen[0..n_gen), then done with state st. */
static void check_events(const client *cl, const int32_t *gen, int n_gen) {
    CHECK_EQ(cl->n, 4 + n_gen + 1);
    CHECK(cl->ev[0].prompt && cl->ev[0].no_logprob);
    CHECK_EQ(cl->ev[0].token, PROMPT[0]);
    for (int i = 1; i < 4; i++) {
        const engine_event *e = &cl->ev[i];
        CHECK(e->prompt && !e->no_logprob && !e->done);
        CHECK_EQ(e->token, PROMPT[i]);
        CHECK(e->sr.logprob == -0.125f * (float)i);
        CHECK_EQ(e->sr.n_top, 2);
        CHECK_EQ(e->sr.top_ids[0], 100 + i);
        CHECK_EQ(e->sr.top_ids[1], 200 + i);
        CHECK(e->sr.top_logprobs[1] == -3.0f);
    }
    for (int i = 0; i < n_gen; i++) {
        CHECK(!cl->ev[4 + i].prompt);
        CHECK_EQ(cl->ev[4 + i].token, gen[i]);
    }
    CHECK(cl->ev[4 + n_gen].done);
    CHECK_EQ(cl->ev[4 + n_gen].state, ENGINE_FINISHED);
    CHECK_EQ(cl->ev[4 + n_gen].finish, ENGINE_FINISH_LENGTH);
    CHECK_EQ(cl->ev[4 + n_gen].n_gen, n_gen);
}

static int prompt_events(const client *cl) {
    int k = 0;
    for (int i = 0; i < cl->n; i++)
        k += cl->ev[i].prompt;
    return k;
}

/* ADMIT -> GRANT -> PREFILL: the request reaches a fake prefill worker. */
static fake *prefilled(uint64_t *req) {
    int before = H.dec.n_admit;
    PUMP_UNTIL(H.dec.n_admit > before);
    *req = H.dec.admit_req;
    fake *p = NULL;
    PUMP_UNTIL((p = owner(*req)) != NULL);
    CHECK(p->prefill_s.flags & PD_FLAG_PROMPT_LP);
    CHECK_EQ(p->prefill_s.n_probs, 2);
    return p;
}

// ----------------------------------------------------------------------------
// Cases

/* Decode's TOKEN overtakes the records: held, shown after them. */
static void case_merge(void) {
    fprintf(stderr, "-- merge\n");
    client cl;
    submit(&cl, 2);
    uint64_t req;
    fake *p = prefilled(&req);
    send_token(req, 7); // overtakes every PROMPT_LP
    pump(50);
    drain(&cl);
    CHECK_EQ(cl.n, 0); // held: nothing shown before the prompt's records
    send_lp(p, req, 1, 2, false, 0);
    pump(50);
    drain(&cl);
    CHECK_EQ(cl.n, 3); // position 0 and two records; the token still held
    send_lp(p, req, 3, 1, true, 0);
    send_token(req, 9);
    send_finish(req, 2);
    wait_done(&cl);
    const int32_t gen[2] = {7, 9};
    check_events(&cl, gen, 2);
    H.b.release(cl.req);
}

/* One router identity for all its workers; request ids far from the clock. */
static void case_ids(uint64_t first_req) {
    fprintf(stderr, "-- ids\n");
    CHECK(H.dec.router_id != 0);
    for (int i = 0; i < H.n_pre; i++) CHECK(H.pre[i].router_id == H.dec.router_id);
    struct timespec ts;
    CHECK_EQ(clock_gettime(CLOCK_REALTIME, &ts), 0);
    uint64_t now_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    uint64_t d = first_req > now_us ? first_req - now_us : now_us - first_req;
    // a random start lands within 2^40 of the clock with probability 2^-22
    if (d <= (1ull << 40))
        fprintf(stderr, "request id %llu is the clock in microseconds (%llu)\n",
                (unsigned long long)first_req, (unsigned long long)now_us);
    CHECK(d > (1ull << 40));
}

/* max_tokens 0: decode's first TOKEN ends it, unseen; decode gets ABORT STOP. */
static void case_prompt_only(void) {
    fprintf(stderr, "-- prompt_only\n");
    client cl;
    submit(&cl, 0);
    uint64_t req;
    fake *p = prefilled(&req);
    send_lp(p, req, 1, 3, true, 0);
    int aborts = H.dec.n_abort;
    send_token(req, 7);
    wait_done(&cl);
    check_events(&cl, NULL, 0);
    PUMP_UNTIL(H.dec.n_abort > aborts);
    CHECK_EQ(H.dec.abort_req, req);
    CHECK_EQ(H.dec.abort_reason, PD_ABORT_STOP);
    H.b.release(cl.req);
}

/* The prefill worker goes away after the first records were shown. */
static void case_worker_lost(void) {
    fprintf(stderr, "-- worker_lost\n");
    client cl;
    submit(&cl, 2);
    uint64_t req;
    fake *p = prefilled(&req);
    send_lp(p, req, 1, 2, false, 0);
    uint64_t end = cl_now_ms(NULL) + TEST_WAIT_MS;
    while (cl.n < 3 && cl_now_ms(NULL) < end) {
        pump(1);
        drain(&cl);
    }
    CHECK_EQ(cl.n, 3); // position 0 and two records reached the client
    int prefills = 0, aborts = H.dec.n_abort;
    for (int i = 0; i < H.n_pre; i++)
        prefills += H.pre[i].n_prefill;
    pd_conn_close(p->c);
    wait_done(&cl);
    CHECK_EQ(cl.n, 4);
    CHECK_EQ(cl.ev[3].state, ENGINE_ABORTED);
    CHECK_EQ(cl.ev[3].err, KS_ERR_PEER_CLOSED);
    PUMP_UNTIL(H.dec.n_abort > aborts);
    CHECK_EQ(H.dec.abort_req, req);
    CHECK_EQ(H.dec.abort_reason, PD_ABORT_WORKER_LOST);
    pump(100);
    int now = 0;
    for (int i = 0; i < H.n_pre; i++)
        now += H.pre[i].n_prefill;
    CHECK_EQ(now, prefills); // not placed on another prefill worker
    H.b.release(cl.req);
}

/* Another prefill worker's records for the request: that worker is cut off
 * (ERROR PROTO), nothing of it is shown, the request completes from its own. */
static void case_foreign(void) {
    fprintf(stderr, "-- foreign\n");
    client cl;
    submit(&cl, 1);
    uint64_t req;
    fake *p = prefilled(&req);
    fake *x = NULL;
    for (int i = 0; i < H.n_pre && !x; i++)
        if (&H.pre[i] != p && H.pre[i].c) x = &H.pre[i];
    CHECK(x);
    send_lp(x, req, 1, 3, true, 0);
    PUMP_UNTIL(x->closed);
    CHECK(x->n_error >= 1);
    drain(&cl);
    CHECK_EQ(cl.n, 0);
    send_lp(p, req, 1, 3, true, 0);
    send_token(req, 11);
    send_finish(req, 1);
    wait_done(&cl);
    const int32_t gen[1] = {11};
    check_events(&cl, gen, 1);
    H.b.release(cl.req);
}

/* A record whose token is not the prompt's: the request ends ABORTED and
 * none of the message's records is delivered; the sender is cut off. */
static void case_bad_token(void) {
    fprintf(stderr, "-- bad_token\n");
    client cl;
    submit(&cl, 1);
    uint64_t req;
    fake *p = prefilled(&req);
    send_lp(p, req, 1, 3, true, 2);
    wait_done(&cl);
    CHECK_EQ(prompt_events(&cl), 0);
    CHECK_EQ(cl.ev[cl.n - 1].state, ENGINE_ABORTED);
    CHECK_EQ(cl.ev[cl.n - 1].err, KS_ERR_PROTO);
    PUMP_UNTIL(p->closed);
    H.b.release(cl.req);
}

/* A request id the router never issued: a protocol error. */
static void case_unknown(void) {
    fprintf(stderr, "-- unknown\n");
    fake *p = NULL;
    for (int i = 0; i < H.n_pre; i++)
        if (H.pre[i].c) p = &H.pre[i];
    CHECK(p);
    send_lp(p, 1u << 30, 1, 3, true, 0);
    PUMP_UNTIL(p->closed);
    CHECK(p->n_error >= 1);
}

int main(void) {
    ks_log_init_env();
    const char *src = getenv("KS_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/kjv-mini.gguf", src ? src : ".");
    FILE *fp = fopen(path, "rb");
    if (!fp) SKIP("models/kjv-mini.gguf not found (set KS_SRC)");
    fclose(fp);
    memset(&H, 0, sizeof H);
    ks_errbuf eb;
    CHECK_EQ(model_load(path, &H.m, &eb), KS_OK);
    cluster_router_opts o;
    cluster_router_opts_default(&o);
    o.m = H.m;
    o.secret = SECRET;
    o.secret_len = sizeof SECRET;
    o.port = 0;
    o.n_ctx = N_CTX;
    o.page_tokens = PAGE_TOKENS;
    o.health_interval_ms = 1000;
    H.g = model_kv_geom(H.m, PAGE_TOKENS, o.kv_type);
    cluster_model_id(H.m, H.model_id);
    CHECK_EQ(cluster_router_create(&o, &H.r, &eb), KS_OK);
    cluster_router_backend(H.r, &H.b);
    int port = cluster_router_port(H.r);
    fake_start(&H.dec, PD_ROLE_DECODE, port);
    H.n_pre = 4;
    for (int i = 0; i < H.n_pre; i++)
        fake_start(&H.pre[i], PD_ROLE_PREFILL, port);

    case_merge();
    case_ids(H.dec.admit_req);
    case_prompt_only();
    case_worker_lost(); // one prefill worker goes
    case_foreign();   // cuts one prefill worker off
    case_bad_token(); // and another
    case_unknown();   // and the last

    cluster_router_destroy(H.r);
    pump(50);
    pd_loop_destroy(H.dec.l);
    for (int i = 0; i < H.n_pre; i++)
        pd_loop_destroy(H.pre[i].l);
    model_free(H.m);
    fprintf(stderr, "ok\n");
    return 0;
}
