/* test_cluster_decode.c — the decode worker (cluster_decode_run) on a thread
 * against an in-process fake router (control listener) and a fake prefill
 * worker (a real data link; KV computed by model_forward on its own pool),
 * both driven by pd_loops on the test thread (docs/pd-protocol.md 5-9).
 *
 * One worker runs through the phases in order; each names the rule it would
 * catch missing:
 *   greedy    — verified handoff + engine_adopt: tokens equal engine_submit's
 *   sampled   — the same with temperature, a seed and top-2 (rng_state carried)
 *   relink    — a second LINK for a prefill id with a live link is refused; the
 *               router's RETIRE closes the live one, then a new LINK gets a
 *               fresh (random) epoch
 *   routers   — worker ids are one router's numbering: a LINK for the same
 *               prefill id under another router's identity comes up beside
 *               the live one; the router's ADMIT binds to its own link, and
 *               its RETIRE cannot close another router's (issue 40)
 *   coverage  — DONE covering less than the prompt: FINISH ERROR, no TOKEN (I6;
 *               fails under KS_BROKEN=no_coverage)
 *   reject    — prefill's REJECT: FINISH carries its reason and message
 *   adapter   — DONE for KV computed under a LoRA adapter the ADMIT did not
 *               name: FINISH ERROR, no TOKEN, pages freed
 *   abort     — router ABORT while GRANTED: ABORT to prefill, pages held in
 *               QUARANTINE until ABORT_ACK (F4; fails under free_before_quiesce)
 *   link_loss — data link closed mid-transfer: FINISH ERROR, pages freed (F5)
 *   and POOL_CHECK clean (I3) after every phase. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cluster/cluster_int.h"
#include "kvseal/engine.h"
#include "kvseal/model.h"
#include "kvseal/sample.h"

#include "../check.h"

#define SECRET "decode-test-secret-0123456789abcdef"
#define PREFILL_ID 7u
#define ROUTER_ID 0x1234567890abcdefull /* the fake router's identity (REGISTER_ACK, LINK) */
#define N_CTX 256
#define PAGE_T 16
#define N_PROMPT 40 /* 3 pages: 16 + 16 + 8 */
#define MAX_TOK 8

// ----------------------------------------------------------------------------
// Harness: fake router + fake prefill on the test thread

typedef struct rframe {
    uint16_t type;
    uint64_t req_id;
    uint8_t *data;
    uint32_t len;
} rframe;

typedef struct harness {
    const model *m;
    uint8_t model_id[32]; /* cluster_model_id(m): in LINK and ADMIT */
    kv_geom g;
    uint32_t tm[PD_MSG_N_TYPES];
    // router side
    pd_loop *rl;
    pd_listener *rls;
    pd_conn *rc;     /* the decode worker's control conn */
    bool registered;
    uint16_t data_port;
    uint32_t reg_pages;
    rframe rf[512];
    int n_rf;
    uint64_t last_health_ns, health_seq;
    // prefill side
    pd_loop *pl;
    pd_conn *pc; /* the data link */
    bool link_open, link_closed;
    int n_pclosed; /* data links closed so far */
    uint64_t epoch;
    bool foreign_link; /* the next LINK claims worker 9 of another model (phase_model) */
    pd_conn *oc;       /* a link from prefill worker PREFILL_ID of another router */
    uint64_t o_epoch;  /* its LINK_ACK's epoch */
    bool o_closed;
    rframe pf[64];
    int n_pf;
    // worker
    pthread_t th;
    atomic_int stop; /* cluster_*_run's stop flag, set by the test thread */
    cluster_worker_opts o;
    ks_err run_err;
    ks_errbuf run_eb;
} harness;

static void rec(rframe *arr, int *n, int cap, const pd_frame *f) {
    CHECK(*n < cap);
    rframe *r = &arr[(*n)++];
    r->type = f->hdr.type;
    r->req_id = f->hdr.req_id;
    r->len = f->payload_len;
    r->data = malloc(f->payload_len ? f->payload_len : 1);
    CHECK(r->data);
    if (f->payload_len) memcpy(r->data, f->payload, f->payload_len);
}

static void send1(pd_conn *c, uint16_t type, uint64_t req_id, const void *p, uint32_t len) {
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    ks_errbuf eb;
    ks_err e = pd_conn_send(c, type, req_id, &iov, len ? 1 : 0, &eb);
    if (e != KS_OK) fprintf(stderr, "send %s: %s\n", pd_msg_type_name(type), eb.msg);
    CHECK(e == KS_OK);
}

// router conn callbacks
static void r_on_open(pd_conn *c, void *ud) {
    harness *h = ud;
    CHECK(h->rc == NULL);
    h->rc = c;
}

static void r_on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    if (f->hdr.type == PD_MSG_REGISTER) {
        pd_msg_register reg;
        CHECK(pd_msg_register_decode(f->payload, f->payload_len, &reg, NULL) == KS_OK);
        CHECK_EQ(reg.role, PD_ROLE_DECODE);
        CHECK_EQ(reg.n_layer, (uint32_t)h->g.n_layer);
        CHECK_EQ(reg.kv_dim, (uint32_t)h->g.kv_dim);
        CHECK_EQ(reg.kv_type, (uint32_t)h->g.kv_type);
        CHECK_EQ(reg.page_tokens, PAGE_T);
        CHECK_EQ(reg.n_ctx, N_CTX);
        uint8_t id[32];
        cluster_model_id(h->m, id);
        CHECK(memcmp(id, reg.model_id, 32) == 0);
        CHECK(reg.data_port != 0);
        h->data_port = reg.data_port;
        h->reg_pages = reg.n_pages;
        pd_msg_register_ack ack = {.worker_id = 5, .health_interval_ms = 1000, .router_id = ROUTER_ID};
        uint8_t buf[16];
        uint32_t len;
        CHECK(pd_msg_register_ack_encode(&ack, buf, sizeof buf, &len, NULL) == KS_OK);
        send1(c, PD_MSG_REGISTER_ACK, 0, buf, len);
        h->registered = true;
        return;
    }
    if (f->hdr.type == PD_MSG_HEALTH_ACK) return;
    rec(h->rf, &h->n_rf, 512, f);
}

static void r_on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)why;
    (void)msg;
    if (h->rc == c) h->rc = NULL;
}

// prefill conn callbacks
static void p_on_open(pd_conn *c, void *ud) {
    harness *h = ud;
    h->link_open = true;
    pd_msg_link lk = {.prefill_worker_id = h->foreign_link ? 9u : PREFILL_ID, .router_id = ROUTER_ID};
    memcpy(lk.model_id, h->model_id, sizeof lk.model_id);
    if (h->foreign_link) lk.model_id[0] ^= 0xff;
    uint8_t buf[PD_MSG_LINK_LEN];
    uint32_t len;
    CHECK(pd_msg_link_encode(&lk, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(c, PD_MSG_LINK, 0, buf, len);
}

static void p_on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    (void)c;
    if (f->hdr.type == PD_MSG_LINK_ACK) {
        pd_msg_link_ack a;
        CHECK(pd_msg_link_ack_decode(f->payload, f->payload_len, &a, NULL) == KS_OK);
        CHECK(a.link_epoch != 0);
        CHECK(a.link_epoch != h->epoch);  // a fresh epoch per link
        h->epoch = a.link_epoch;
        return;
    }
    rec(h->pf, &h->n_pf, 64, f);
}

// the other router's link
#define OTHER_ROUTER_ID 0x0fedcba987654321ull
static void o_on_open(pd_conn *c, void *ud) {
    harness *h = ud;
    pd_msg_link lk = {.prefill_worker_id = PREFILL_ID, .router_id = OTHER_ROUTER_ID};
    memcpy(lk.model_id, h->model_id, sizeof lk.model_id);
    uint8_t buf[PD_MSG_LINK_LEN];
    uint32_t len;
    CHECK(pd_msg_link_encode(&lk, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(c, PD_MSG_LINK, 0, buf, len);
}
static void o_on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    (void)c;
    if (f->hdr.type != PD_MSG_LINK_ACK) return;
    pd_msg_link_ack a;
    CHECK(pd_msg_link_ack_decode(f->payload, f->payload_len, &a, NULL) == KS_OK);
    h->o_epoch = a.link_epoch;
}
static void o_on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)c, (void)why, (void)msg;
    h->o_closed = true;
    h->oc = NULL;
}

static void p_on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)why;
    (void)msg;
    h->n_pclosed++;
    if (h->pc == c) {
        h->pc = NULL;
        h->link_closed = true;
        h->link_open = false;
    }
}

/* Runs both loops once (short waits) and sends HEALTH every 500 ms. */
static void pump(harness *h) {
    CHECK(pd_loop_run_once(h->rl, 2) == KS_OK);
    CHECK(pd_loop_run_once(h->pl, 2) == KS_OK);
    uint64_t now = ks_now_ns();
    if (h->rc && h->registered && now - h->last_health_ns > 500000000ull) {
        h->last_health_ns = now;
        pd_msg_health hm = {.seq = ++h->health_seq};
        uint8_t buf[8];
        uint32_t len;
        CHECK(pd_msg_health_encode(&hm, buf, sizeof buf, &len, NULL) == KS_OK);
        send1(h->rc, PD_MSG_HEALTH, 0, buf, len);
    }
}

typedef bool (*pred_fn)(harness *h, uint64_t arg);

static void wait_for(harness *h, pred_fn p, uint64_t arg, const char *what) {
    uint64_t t0 = ks_now_ns();
    while (!p(h, arg)) {
        if (ks_now_ns() - t0 > TEST_WAIT_MS * 1000000ull) {
            fprintf(stderr, "timed out waiting for %s\n", what);
            CHECK(!"timeout");
        }
        pump(h);
    }
}

static int count_rf(const harness *h, uint64_t req_id, uint16_t type) {
    int c = 0;
    for (int i = 0; i < h->n_rf; i++)
        if (h->rf[i].req_id == req_id && h->rf[i].type == type) c++;
    return c;
}

static const rframe *find_rf(const harness *h, uint64_t req_id, uint16_t type) {
    for (int i = 0; i < h->n_rf; i++)
        if (h->rf[i].req_id == req_id && h->rf[i].type == type) return &h->rf[i];
    return NULL;
}

static bool p_registered(harness *h, uint64_t a) {
    (void)a;
    return h->registered;
}
static bool p_linked(harness *h, uint64_t a) { return h->epoch != 0 && h->epoch != a; }
static bool p_grant_or_deny(harness *h, uint64_t id) {
    return find_rf(h, id, PD_MSG_GRANT) || find_rf(h, id, PD_MSG_DENY);
}
static bool p_finish(harness *h, uint64_t id) { return find_rf(h, id, PD_MSG_FINISH) != NULL; }
static bool p_pclosed(harness *h, uint64_t n) { return (uint64_t)h->n_pclosed >= n; }
static bool p_pf_abort(harness *h, uint64_t id) {
    for (int i = 0; i < h->n_pf; i++)
        if (h->pf[i].req_id == id && h->pf[i].type == PD_MSG_ABORT) return true;
    return false;
}
static bool p_link_closed(harness *h, uint64_t a) {
    (void)a;
    return h->link_closed;
}

static void *worker_main(void *arg) {
    harness *h = arg;
    h->run_err = cluster_decode_run(&h->o, &h->stop, &h->run_eb);
    return NULL;
}

static void open_link(harness *h) {
    uint64_t old = h->epoch;
    h->link_closed = false;
    CHECK(pd_tcp_connect(h->pl, "127.0.0.1", h->data_port, 2000,
                         &(pd_conn_cbs){.on_open = p_on_open, .on_frame = p_on_frame,
                                        .on_close = p_on_close, .type_max = h->tm,
                                        .n_types = PD_MSG_N_TYPES,
                                        .peer_roles = 1u << PD_ROLE_DECODE},
                         h, &h->pc, NULL) == KS_OK);
    wait_for(h, p_linked, old, "LINK_ACK");
}

static void h_start(harness *h, const model *m) {
    memset(h, 0, sizeof *h);
    h->m = m;
    cluster_model_id(m, h->model_id);
    engine_opts d; // pages travel in the engine's default KV type (f16)
    engine_opts_default(&d);
    h->g = model_kv_geom(m, PAGE_T, d.kv_type);
    CHECK(pd_msg_type_max(&h->g, h->tm, NULL) == KS_OK);
    pd_loop_cfg rc = {.secret = (const uint8_t *)SECRET, .secret_len = strlen(SECRET),
                      .role = PD_ROLE_ROUTER, .max_payload = PD_MSG_MAX_FRAME};
    CHECK(pd_loop_create(&rc, &h->rl, NULL) == KS_OK);
    pd_loop_cfg pc = rc;
    pc.role = PD_ROLE_PREFILL;
    CHECK(pd_loop_create(&pc, &h->pl, NULL) == KS_OK);
    pd_conn_cbs cb = {.on_open = r_on_open, .on_frame = r_on_frame, .on_close = r_on_close,
                      .type_max = h->tm, .n_types = PD_MSG_N_TYPES,
                      .peer_roles = 1u << PD_ROLE_DECODE};
    CHECK(pd_tcp_listen(h->rl, "127.0.0.1", 0, &cb, h, &h->rls, NULL) == KS_OK);

    cluster_worker_opts *o = &h->o;
    o->m = m;
    o->secret = (const uint8_t *)SECRET;
    o->secret_len = strlen(SECRET);
    o->router_host = "127.0.0.1";
    o->router_port = pd_listener_port(h->rls);
    o->t_router_ms = TEST_WAIT_MS; // the test thread runs model_forward between HEALTHs
    o->data_host = "127.0.0.1";
    o->data_port = 0;
    engine_opts_default(&o->eng);
    o->eng.m = m;
    o->eng.n_ctx = N_CTX;
    o->eng.kv_pages = 64;
    o->eng.page_tokens = PAGE_T;
    o->eng.n_threads = 1;
    CHECK(pthread_create(&h->th, NULL, worker_main, h) == 0);
    wait_for(h, p_registered, 0, "REGISTER");
    open_link(h);
}

static void h_stop(harness *h) {
    atomic_store(&h->stop, 1);
    // keep serving the sockets while the worker shuts down
    uint64_t t0 = ks_now_ns();
    for (;;) {
        pump(h);
        if (pthread_tryjoin_np(h->th, NULL) == 0) break;
        CHECK(ks_now_ns() - t0 < TEST_WAIT_MS * 1000000ull);
    }
    if (h->run_err != KS_OK) fprintf(stderr, "decode run: %s\n", h->run_eb.msg);
    CHECK_EQ(h->run_err, KS_OK);
    pd_loop_destroy(h->pl);
    pd_loop_destroy(h->rl);
    for (int i = 0; i < h->n_rf; i++) free(h->rf[i].data);
    for (int i = 0; i < h->n_pf; i++) free(h->pf[i].data);
}

// ----------------------------------------------------------------------------
// Router actions

static bool g_sampled; /* the current phase samples (temperature, seed, top-n) */

static void sampling(sample_params *sp) {
    sample_params_default(sp);
    sp->seed = 42;
    if (g_sampled) {
        sp->temperature = 1.0f;
        sp->top_k = 0;
        sp->top_p = 1.0f;
        sp->min_p = 0.0f;
        sp->seed = 1234567;
        sp->n_probs = 2;
    } else {
        sp->temperature = 0.0f;  // greedy
    }
}

/* ADMIT for model model_id; waits for the GRANT or DENY. */
static void admit_for(harness *h, uint64_t id, uint32_t n_prompt, const uint8_t *model_id) {
    sample_params sp;
    sampling(&sp);
    pd_msg_admit a;
    memset(&a, 0, sizeof a);
    a.n_prompt = n_prompt;
    a.prefill_worker_id = PREFILL_ID;
    memcpy(a.model_id, model_id, sizeof a.model_id);
    char msg[256];
    CHECK(cl_sampling_to_msg(&sp, MAX_TOK, true, NULL, 0, NULL, 0, &a.s, msg, sizeof msg));
    uint8_t buf[PD_MSG_ADMIT_FIXED];
    uint32_t len;
    CHECK(pd_msg_admit_encode(&a, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->rc, PD_MSG_ADMIT, id, buf, len);
    wait_for(h, p_grant_or_deny, id, "GRANT");
}

static void admit(harness *h, uint64_t id, uint32_t n_prompt) {
    admit_for(h, id, n_prompt, h->model_id);
    CHECK(find_rf(h, id, PD_MSG_GRANT) != NULL);
}

static void router_abort(harness *h, uint64_t id, uint32_t reason) {
    pd_msg_abort a = {.reason = reason};
    uint8_t buf[4];
    uint32_t len;
    CHECK(pd_msg_abort_encode(&a, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->rc, PD_MSG_ABORT, id, buf, len);
}

static uint64_t check_seq = 1000;
static bool p_check_ack(harness *h, uint64_t id) { return find_rf(h, id, PD_MSG_POOL_CHECK_ACK); }

static pd_msg_pool_check_ack pool_check(harness *h) {
    uint64_t id = ++check_seq;
    send1(h->rc, PD_MSG_POOL_CHECK, id, NULL, 0);
    wait_for(h, p_check_ack, id, "POOL_CHECK_ACK");
    const rframe *f = find_rf(h, id, PD_MSG_POOL_CHECK_ACK);
    pd_msg_pool_check_ack a;
    CHECK(pd_msg_pool_check_ack_decode(f->data, f->len, &a, NULL) == KS_OK);
    return a;
}

/* POOL_CHECK until clean (the last FINISH may precede the F1 free by a step). */
static void expect_clean(harness *h) {
    uint64_t t0 = ks_now_ns();
    for (;;) {
        pd_msg_pool_check_ack a = pool_check(h);
        if (a.clean) {
            CHECK_EQ(a.free_pages, h->reg_pages);
            CHECK_EQ(a.quarantined, 0);
            return;
        }
        if (ks_now_ns() - t0 > 5000000000ull) {
            fprintf(stderr, "pool not clean: active %u free %u alloc %u ready %u quar %u\n",
                    a.active, a.free_pages, a.allocated, a.ready, a.quarantined);
            CHECK(!"pool not clean");
        }
    }
}

// ----------------------------------------------------------------------------
// The fake prefill: the prompt's KV on its own pool, the first token sampled
// as the engine samples it, KV_PAGE frames per grant page

static int32_t prompt_tok(uint32_t i) { return (int32_t)((i * 37u + 11u) % 2000u); }

typedef struct pre {
    kv_pool *pool;
    kv_seq seq;
    model_ctx *ctx;
    float *logits;
    sample_result first;
    uint64_t draws;
} pre;

static void pre_compute(harness *h, pre *p, uint32_t n_prompt) {
    memset(p, 0, sizeof *p);
    CHECK(kv_pool_create(&h->g, 16, KV_SCRUB_ZERO, &p->pool, NULL) == KS_OK);
    kv_seq_init(p->pool, &p->seq);
    CHECK(kv_seq_reserve(p->pool, &p->seq, n_prompt, NULL) == KS_OK);
    CHECK(model_ctx_create(h->m, p->pool, 1, (int32_t)n_prompt, N_CTX, &p->ctx, NULL) == KS_OK);
    int32_t tok[N_PROMPT], pos[N_PROMPT], sq[N_PROMPT], orow[N_PROMPT];
    CHECK(n_prompt <= N_PROMPT);
    for (uint32_t i = 0; i < n_prompt; i++) {
        tok[i] = prompt_tok(i);
        pos[i] = (int32_t)i;
        sq[i] = 0;
        orow[i] = i + 1 == n_prompt ? 0 : -1;
    }
    kv_seq *seqs[1] = {&p->seq};
    model_batch b = {.n_tokens = (int32_t)n_prompt, .tokens = tok, .pos = pos, .seq = sq,
                     .out_row = orow, .n_out = 1, .n_seqs = 1, .seqs = seqs};
    int32_t n_vocab = model_hp(h->m)->n_vocab;
    p->logits = malloc((size_t)n_vocab * sizeof(float));
    CHECK(p->logits);
    CHECK(model_forward(p->ctx, &b, p->logits, NULL) == KS_OK);
    sample_params sp;
    sampling(&sp);
    sampler *s;
    CHECK(sampler_create(&sp, n_vocab, &s, NULL) == KS_OK);
    sampler_sample(s, p->logits, &p->first);
    p->draws = sampler_draws(s);
    sampler_destroy(s);
}

static void pre_free(pre *p) {
    free(p->logits);
    model_ctx_free(p->ctx);
    kv_seq_release(p->pool, &p->seq);
    CHECK(kv_pool_all_free_and_scrubbed(p->pool));
    kv_pool_destroy(p->pool);
}

/* Sends KV_PAGE for grant pages [0, n_pages_send) of request id. */
static void pre_send_pages(harness *h, pre *p, uint64_t id, uint32_t n_pages_send) {
    const rframe *gf = find_rf(h, id, PD_MSG_GRANT);
    CHECK(gf);
    pd_msg_grant g;
    CHECK(pd_msg_grant_decode(gf->data, gf->len, &g, NULL) == KS_OK);
    CHECK_EQ(g.link_epoch, h->epoch);
    CHECK(n_pages_send <= g.n_pages);
    for (uint32_t i = 0; i < n_pages_send; i++) {
        pd_msg_grant_entry e = pd_msg_grant_entry_at(&g, i);
        pd_msg_kv_page ph = {.page_index = i, .page_id = e.page_id, .tag_seq_uid = g.seq_uid,
                             .tag_gen = e.gen, .n_rows = e.n_tokens, .layer_first = 0,
                             .layer_count = (uint32_t)h->g.n_layer};
        uint8_t hdr[PD_MSG_KV_PAGE_HDR];
        uint32_t hl;
        CHECK(pd_msg_kv_page_encode(&ph, &h->g, hdr, sizeof hdr, &hl, NULL) == KS_OK);
        struct iovec iov[PD_MAX_IOV];
        int n = 0;
        iov[n++] = (struct iovec){.iov_base = hdr, .iov_len = hl};
        size_t plane = (size_t)e.n_tokens * kv_row_bytes(&h->g);
        for (int l = 0; l < h->g.n_layer; l++) {
            const void *k, *v;
            CHECK(kv_seq_span_read(p->pool, &p->seq, i, l, e.n_tokens, &k, &v) == KS_OK);
            iov[n++] = (struct iovec){.iov_base = (void *)k, .iov_len = plane};
            iov[n++] = (struct iovec){.iov_base = (void *)v, .iov_len = plane};
        }
        CHECK(pd_conn_send(h->pc, PD_MSG_KV_PAGE, id, iov, n, NULL) == KS_OK);
    }
}

static uint8_t g_done_adapter[PD_MSG_ADAPTER_BYTES]; /* the digest DONE claims (zero: none) */

static void pre_send_done(harness *h, pre *p, uint64_t id, uint32_t covered) {
    pd_msg_done d = {.covered = covered, .first_token = p->first.token,
                     .logprob = p->first.logprob, .n_top = (uint32_t)p->first.n_top,
                     .rng_state = p->draws};
    memcpy(d.adapter, g_done_adapter, sizeof d.adapter);
    pd_msg_top top[SAMPLE_MAX_TOP];
    for (int i = 0; i < p->first.n_top; i++)
        top[i] = (pd_msg_top){.id = p->first.top_ids[i], .logprob = p->first.top_logprobs[i]};
    uint8_t buf[32 + 8 * SAMPLE_MAX_TOP + PD_MSG_ADAPTER_BYTES];
    uint32_t len;
    CHECK(pd_msg_done_encode(&d, top, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->pc, PD_MSG_DONE, id, buf, len);
}

// ----------------------------------------------------------------------------
// Reference: the same prompt on a local engine (engine_submit)

static int local_tokens(const model *m, int32_t *out, int cap) {
    engine_opts eo;
    engine_opts_default(&eo);
    eo.m = m;
    eo.n_ctx = N_CTX;
    eo.kv_pages = 64;
    eo.page_tokens = PAGE_T;
    eo.n_threads = 1;
    eo.prefix_cache = false;
    engine *e;
    CHECK(engine_create(&eo, &e, NULL) == KS_OK);
    int32_t toks[N_PROMPT];
    for (uint32_t i = 0; i < N_PROMPT; i++) toks[i] = prompt_tok(i);
    engine_params p;
    memset(&p, 0, sizeof p);
    p.tenant = "t";
    p.prompt = toks;
    p.n_prompt = N_PROMPT;
    p.max_tokens = MAX_TOK;
    sampling(&p.sp);
    p.ignore_eos = true;
    engine_req *r;
    CHECK(engine_submit(e, &p, &r, NULL) == KS_OK);
    int n = 0;
    engine_event ev;
    for (;;) {
        ks_err er = engine_req_next(r, &ev, 10000);
        CHECK(er == KS_OK);
        if (ev.token >= 0) {
            CHECK(n < cap);
            out[n++] = ev.token;
        }
        if (ev.done) break;
    }
    CHECK_EQ(ev.finish, ENGINE_FINISH_LENGTH);
    engine_req_release(r);
    engine_destroy(e);
    return n;
}

// ----------------------------------------------------------------------------
// Phases

/* Generation from a verified handoff equals engine_submit's on a local
 * engine: greedy (id 1), and sampled with a seed and top-2 (id 7: the
 * sampler continues from DONE's rng_state). */
static void phase_generate(harness *h, uint64_t id, bool sampled) {
    g_sampled = sampled;
    int32_t want[64];
    int n_want = local_tokens(h->m, want, 64);
    CHECK_EQ(n_want, MAX_TOK);
    pre p;
    pre_compute(h, &p, N_PROMPT);
    CHECK_EQ(p.first.token, want[0]);
    if (sampled) CHECK(p.draws > 0);
    admit(h, id, N_PROMPT);
    pre_send_pages(h, &p, id, 3);
    pre_send_done(h, &p, id, N_PROMPT);
    wait_for(h, p_finish, id, "FINISH");
    int n = 0;
    for (int i = 0; i < h->n_rf; i++) {
        if (h->rf[i].req_id != id || h->rf[i].type != PD_MSG_TOKEN) continue;
        pd_msg_token t;
        CHECK(pd_msg_token_decode(h->rf[i].data, h->rf[i].len, &t, NULL) == KS_OK);
        CHECK(n < MAX_TOK);
        CHECK_EQ(t.token, want[n]);
        CHECK_EQ(t.n_top, sampled ? 2u : 0u);
        n++;
    }
    CHECK_EQ(n, MAX_TOK);
    const rframe *ff = find_rf(h, id, PD_MSG_FINISH);
    pd_msg_finish fin;
    CHECK(pd_msg_finish_decode(ff->data, ff->len, &fin, NULL) == KS_OK);
    CHECK_EQ(fin.finish, PD_FINISH_LENGTH);
    CHECK_EQ(fin.n_prompt, N_PROMPT);
    CHECK_EQ(fin.n_gen, MAX_TOK);
    CHECK_EQ(count_rf(h, id, PD_MSG_FINISH), 1);
    pre_free(&p);
    expect_clean(h);
    g_sampled = false;
}

static bool p_n_closed(harness *h, uint64_t n) { return (uint64_t)h->n_pclosed >= n; }

/* A second LINK for a prefill worker id that has a live link is refused (a
 * relay or a confused worker never replaces a live link); once the router's
 * RETIRE has closed the live link (F5 for it), the worker links again with a
 * fresh epoch and grants bind to it. */
static void phase_relink(harness *h) {
    int closed0 = h->n_pclosed;
    uint64_t old = h->epoch;
    pd_conn *live = h->pc, *second = NULL;
    CHECK(pd_tcp_connect(h->pl, "127.0.0.1", h->data_port, 2000,
                         &(pd_conn_cbs){.on_open = p_on_open, .on_frame = p_on_frame,
                                        .on_close = p_on_close, .type_max = h->tm,
                                        .n_types = PD_MSG_N_TYPES,
                                        .peer_roles = 1u << PD_ROLE_DECODE},
                         h, &second, NULL) == KS_OK);
    wait_for(h, p_n_closed, (uint64_t)closed0 + 1, "second LINK refused");
    CHECK(h->pc == live);
    CHECK_EQ(h->epoch, old);
    CHECK(!h->link_closed);
    pd_msg_link rt = {.prefill_worker_id = PREFILL_ID, .router_id = ROUTER_ID};
    memcpy(rt.model_id, h->model_id, sizeof rt.model_id);
    uint8_t buf[PD_MSG_LINK_LEN];
    uint32_t len;
    CHECK(pd_msg_link_encode(&rt, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->rc, PD_MSG_RETIRE, 0, buf, len);
    wait_for(h, p_link_closed, 0, "retired link closed");
    open_link(h);
    CHECK(h->epoch != old);
    CHECK(h->pc != NULL);
    admit(h, 8, 4);  // pre_send_pages-style epoch check on the grant
    const rframe *gf = find_rf(h, 8, PD_MSG_GRANT);
    pd_msg_grant g;
    CHECK(pd_msg_grant_decode(gf->data, gf->len, &g, NULL) == KS_OK);
    CHECK_EQ(g.link_epoch, h->epoch);
    router_abort(h, 8, PD_ABORT_CLIENT_GONE);
    wait_for(h, p_pf_abort, 8, "ABORT 8 on the link");
    send1(h->pc, PD_MSG_ABORT_ACK, 8, NULL, 0);
    expect_clean(h);
}

static bool p_o_linked(harness *h, uint64_t a) { (void)a; return h->o_epoch != 0 || h->o_closed; }
static bool p_o_closed(harness *h, uint64_t a) { (void)a; return h->o_closed; }

/* Another router's prefill worker PREFILL_ID (its own numbering) links
 * beside the live link of ours; our ADMIT binds to ours; a RETIRE naming
 * the other router's worker is ignored; losing that link changes nothing
 * of ours. */
static void phase_routers(harness *h) {
    CHECK(pd_tcp_connect(h->pl, "127.0.0.1", h->data_port, 2000,
                         &(pd_conn_cbs){.on_open = o_on_open, .on_frame = o_on_frame,
                                        .on_close = o_on_close, .type_max = h->tm,
                                        .n_types = PD_MSG_N_TYPES,
                                        .peer_roles = 1u << PD_ROLE_DECODE},
                         h, &h->oc, NULL) == KS_OK);
    wait_for(h, p_o_linked, 0, "the other router's LINK");
    CHECK(!h->o_closed);  // not refused: (router, id) differs from the live link's
    CHECK(h->o_epoch != 0 && h->o_epoch != h->epoch);
    CHECK(!h->link_closed);
    admit(h, 21, 4);
    const rframe *gf = find_rf(h, 21, PD_MSG_GRANT);
    pd_msg_grant g;
    CHECK(pd_msg_grant_decode(gf->data, gf->len, &g, NULL) == KS_OK);
    CHECK_EQ(g.link_epoch, h->epoch);  // our router's link, not the other's
    pd_msg_link rt = {.prefill_worker_id = PREFILL_ID, .router_id = OTHER_ROUTER_ID};
    memcpy(rt.model_id, h->model_id, sizeof rt.model_id);
    uint8_t buf[PD_MSG_LINK_LEN];
    uint32_t len;
    CHECK(pd_msg_link_encode(&rt, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->rc, PD_MSG_RETIRE, 0, buf, len);  // not this router's worker: ignored
    router_abort(h, 21, PD_ABORT_CLIENT_GONE);
    wait_for(h, p_pf_abort, 21, "ABORT 21 on our link");
    send1(h->pc, PD_MSG_ABORT_ACK, 21, NULL, 0);
    expect_clean(h);
    CHECK(!h->o_closed && !h->link_closed);
    pd_conn_close(h->oc);
    wait_for(h, p_o_closed, 0, "the other link closed");
    CHECK(!h->link_closed);
    expect_clean(h);
}

static void phase_coverage(harness *h) {
    pre p;
    pre_compute(h, &p, N_PROMPT);
    admit(h, 2, N_PROMPT);
    pre_send_pages(h, &p, 2, 2);         // the last page (8 tokens) never sent
    pre_send_done(h, &p, 2, 2 * PAGE_T); // and prefill says so
    wait_for(h, p_finish, 2, "FINISH 2");
    const rframe *ff = find_rf(h, 2, PD_MSG_FINISH);
    pd_msg_finish fin;
    CHECK(pd_msg_finish_decode(ff->data, ff->len, &fin, NULL) == KS_OK);
    CHECK_EQ(fin.finish, PD_FINISH_ERROR);
    CHECK_EQ(fin.n_gen, 0);
    CHECK_EQ(count_rf(h, 2, PD_MSG_TOKEN), 0);  // nothing generated from unverified KV
    pre_free(&p);
    expect_clean(h);
}

/* Waits for request id's FINISH: ERROR with reason, a message holding
 * what, and no TOKEN before it (nothing generated). */
static void expect_failed(harness *h, uint64_t id, uint32_t reason, const char *what) {
    wait_for(h, p_finish, id, "FINISH");
    const rframe *ff = find_rf(h, id, PD_MSG_FINISH);
    pd_msg_finish fin;
    CHECK(pd_msg_finish_decode(ff->data, ff->len, &fin, NULL) == KS_OK);
    CHECK_EQ(fin.finish, PD_FINISH_ERROR);
    CHECK_EQ(fin.reason, reason);
    char msg[PD_MSG_MAX_TEXT + 1];
    snprintf(msg, sizeof msg, "%.*s", (int)fin.msg_len, fin.msg);
    CHECK_STR_HAS(msg, what);
    CHECK_EQ(count_rf(h, id, PD_MSG_TOKEN), 0);
}

/* A DONE whose KV was computed under a LoRA adapter the ADMIT did not name
 * (a router or prefill mixing requests up): every page arrived and covers
 * the prompt, yet none is used; FINISH ERROR INTERNAL, no TOKEN, the pages
 * freed and scrubbed. */
static void phase_adapter(harness *h) {
    pre p;
    pre_compute(h, &p, N_PROMPT);
    admit(h, 12, N_PROMPT);
    pre_send_pages(h, &p, 12, 3);
    memset(g_done_adapter, 0x5a, sizeof g_done_adapter);
    pre_send_done(h, &p, 12, N_PROMPT);
    memset(g_done_adapter, 0, sizeof g_done_adapter);
    expect_failed(h, 12, ADMIT_INTERNAL, "another LoRA adapter");
    pre_free(&p);
    expect_clean(h);
}

/* Prefill's REJECT on the link (F3): the grant is freed at once and the
 * FINISH carries the REJECT's reason and message, so the router decides the
 * same whichever of prefill's REJECT and this FINISH reaches it first (a
 * draining prefill's REJECT used to reach the client as 400 when FINISH won). */
static void phase_reject(harness *h) {
    admit(h, 9, N_PROMPT);
    pd_msg_reject rj = {
        .reason = ADMIT_DRAINING, .msg = "the prefill worker is shutting down", .msg_len = 35};
    uint8_t buf[64];
    uint32_t len;
    CHECK(pd_msg_reject_encode(&rj, buf, sizeof buf, &len, NULL) == KS_OK);
    send1(h->pc, PD_MSG_REJECT, 9, buf, len);
    expect_failed(h, 9, ADMIT_DRAINING, rj.msg);
    expect_clean(h); // freed directly: nothing quarantined
}

/* Issue 40: an ADMIT for another model is DENY MODEL, naming both ids, and
 * nothing is reserved (no page of one model is granted to another's request). */
static void phase_model(harness *h) {
    uint8_t other[32];
    memcpy(other, h->model_id, sizeof other);
    other[0] ^= 0xff;
    admit_for(h, 10, N_PROMPT, other);
    CHECK(find_rf(h, 10, PD_MSG_GRANT) == NULL);
    const rframe *df = find_rf(h, 10, PD_MSG_DENY);
    CHECK(df != NULL);
    pd_msg_deny d;
    CHECK(pd_msg_deny_decode(df->data, df->len, &d, NULL) == KS_OK);
    CHECK_EQ(d.reason, PD_DENY_MODEL);
    char msg[PD_MSG_MAX_TEXT + 1];
    snprintf(msg, sizeof msg, "%.*s", (int)d.msg_len, d.msg);
    CHECK_STR_HAS(msg, "no page crosses models");
    expect_clean(h);
    // a data link from a prefill worker of another model never comes up: ERROR
    // naming both models, closed; the live link is untouched
    uint64_t live = h->epoch;
    int closed = h->n_pclosed;
    pd_conn *bad = NULL;
    h->foreign_link = true;
    CHECK(pd_tcp_connect(h->pl, "127.0.0.1", h->data_port, 2000,
                         &(pd_conn_cbs){.on_open = p_on_open, .on_frame = p_on_frame,
                                        .on_close = p_on_close, .type_max = h->tm,
                                        .n_types = PD_MSG_N_TYPES,
                                        .peer_roles = 1u << PD_ROLE_DECODE},
                         h, &bad, NULL) == KS_OK);
    wait_for(h, p_pclosed, (uint64_t)closed + 1, "the foreign link closed");
    h->foreign_link = false;
    CHECK_EQ(h->epoch, live); // no LINK_ACK came
    const rframe *ef = NULL;
    for (int i = 0; i < h->n_pf; i++)
        if (h->pf[i].type == PD_MSG_ERROR) ef = &h->pf[i];
    CHECK(ef != NULL);
    pd_msg_error em;
    CHECK(pd_msg_error_decode(ef->data, ef->len, &em, NULL) == KS_OK);
    snprintf(msg, sizeof msg, "%.*s", (int)em.msg_len, em.msg);
    CHECK_STR_HAS(msg, "LINK refused: prefill worker 9 serves model");
    CHECK_STR_HAS(msg, "no page crosses models");
    CHECK(h->pc != NULL && !h->link_closed);
    admit(h, 11, 4); // the live link still grants
    router_abort(h, 11, PD_ABORT_CLIENT_GONE);
    wait_for(h, p_pf_abort, 11, "ABORT 11 on the link");
    send1(h->pc, PD_MSG_ABORT_ACK, 11, NULL, 0);
    expect_clean(h);
}

static void phase_abort(harness *h) {
    admit(h, 3, N_PROMPT);
    router_abort(h, 3, PD_ABORT_CLIENT_GONE);
    wait_for(h, p_pf_abort, 3, "ABORT on the link");
    wait_for(h, p_finish, 3, "FINISH 3");
    const rframe *ff = find_rf(h, 3, PD_MSG_FINISH);
    pd_msg_finish fin;
    CHECK(pd_msg_finish_decode(ff->data, ff->len, &fin, NULL) == KS_OK);
    CHECK_EQ(fin.finish, PD_FINISH_ABORT);
    // I5: until prefill acknowledges, the grant's pages stay in QUARANTINE
    pd_msg_pool_check_ack a = pool_check(h);
    CHECK_EQ(a.clean, 0);
    CHECK_EQ(a.quarantined, 3);
    CHECK_EQ(a.free_pages, h->reg_pages - 3);
    send1(h->pc, PD_MSG_ABORT_ACK, 3, NULL, 0);
    expect_clean(h);
    CHECK_EQ(count_rf(h, 3, PD_MSG_TOKEN), 0);
    CHECK_EQ(count_rf(h, 3, PD_MSG_FINISH), 1);
}

static void phase_link_loss(harness *h) {
    pre p;
    pre_compute(h, &p, N_PROMPT);
    admit(h, 4, N_PROMPT);
    pre_send_pages(h, &p, 4, 1);
    // make sure the page went out, then drop the link mid-transfer
    for (int i = 0; i < 20; i++) pump(h);
    pd_conn_close(h->pc);
    wait_for(h, p_link_closed, 0, "link close");
    wait_for(h, p_finish, 4, "FINISH 4");
    const rframe *ff = find_rf(h, 4, PD_MSG_FINISH);
    pd_msg_finish fin;
    CHECK(pd_msg_finish_decode(ff->data, ff->len, &fin, NULL) == KS_OK);
    CHECK_EQ(fin.finish, PD_FINISH_ERROR);
    CHECK_EQ(count_rf(h, 4, PD_MSG_TOKEN), 0);
    pre_free(&p);
    expect_clean(h);
    // a new link gets a new epoch, and the worker grants on it again
    open_link(h);
    admit(h, 5, 4);
    router_abort(h, 5, PD_ABORT_CLIENT_GONE);
    wait_for(h, p_pf_abort, 5, "ABORT 5 on the link");
    send1(h->pc, PD_MSG_ABORT_ACK, 5, NULL, 0);
    expect_clean(h);
}

int main(void) {
    const char *src = getenv("KS_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/kjv-mini.gguf", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) SKIP("models/kjv-mini.gguf not found (set KS_SRC)");
    fclose(f);
    ks_log_set_level(KS_LOG_WARN);
    model *m;
    ks_errbuf eb;
    if (model_load(path, &m, &eb) != KS_OK) {
        fprintf(stderr, "model_load: %s\n", eb.msg);
        CHECK(!"model_load");
    }
    harness *h = calloc(1, sizeof *h);
    CHECK(h);
    h_start(h, m);
    phase_generate(h, 1, false);
    printf("ok greedy\n");
    phase_generate(h, 7, true);
    printf("ok sampled\n");
    phase_relink(h);
    printf("ok relink\n");
    phase_routers(h);
    printf("ok routers\n");
    phase_coverage(h);
    printf("ok coverage\n");
    phase_reject(h);
    printf("ok reject\n");
    phase_adapter(h);
    printf("ok adapter\n");
    phase_model(h);
    printf("ok model\n");
    phase_abort(h);
    printf("ok abort\n");
    phase_link_loss(h);
    printf("ok link_loss\n");
    // shutdown with a transfer in flight: ABORT SHUTDOWN to prefill, the link
    // closes (F5) and the worker still stops cleanly (ASan: nothing leaks)
    admit(h, 6, N_PROMPT);
    h_stop(h);
    CHECK(p_pf_abort(h, 6) || h->link_closed);
    printf("ok shutdown\n");
    free(h);
    model_free(m);
    return 0;
}
