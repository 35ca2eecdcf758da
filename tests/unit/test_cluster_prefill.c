/* test_cluster_prefill.c — the prefill worker (cluster_prefill_run,
 * src/cluster/prefill.c) on a thread of its own against an in-process fake
 * router and fake decode worker, both on pd_loops driven by this thread. The
 * fake decode runs a real pd_recv over its own pool and receives KV_PAGE
 * payloads straight into it through the transport's sink, as the decode
 * worker does. Checks (docs/pd-protocol.md sections 5-7):
 *   - the KV decode commits equals what a local model_forward computes for
 *     the prompt (prefill chunks the prompt; batch invariance makes it exact),
 *     and DONE's first token is the greedy argmax of the last position;
 *   - I4: a PREFILL with n_prompt + max_tokens > n_ctx, or with a grant of a
 *     stale link epoch, gets REJECT and never a KV_PAGE or DONE;
 *   - a router ABORT right after PREFILL ends with ABORT_ACK as the last
 *     frame for the request on the link, and decode frees by F4;
 *   - echo (PD_FLAG_PROMPT_LP): the PROMPT_LP records reach the router in
 *     position order, in chunks, LAST on the final one, and equal bit for
 *     bit what sample_logprobs_row gives over a local model_forward's rows;
 *     a prompt the prefix cache holds is still computed in full;
 *   - afterwards POOL_CHECK reports the prefill pool all free and scrubbed.
 * Uses models/kjv-mini.gguf (KS_SRC). */
#include "cluster/cluster_int.h"
#include "kvseal/pd_recv.h"

#include "../check.h"

#include <pthread.h>

static const uint8_t SECRET[32] = "cluster-secret-prefill-012345678";

#define PAGE_TOKENS 4
#define N_CTX 64
#define PRE_PAGES 40u
#define DEC_PAGES 64u
#define PREFILL_ID 5u /* the router's id for the prefill worker */
#define DECODE_ID 3u  /* the router's id for the decode worker */
#define EPOCH H.epoch /* the data link's current epoch (77, then 78 after a re-link) */

// ----------------------------------------------------------------------------
// Harness

typedef struct {
    uint16_t type;
    uint64_t req_id;
} logged;

typedef struct {
    model *m;
    kv_geom g;
    // the worker
    pthread_t th;
    atomic_int stop; /* cluster_*_run's stop flag, set by the test thread */
    ks_err run_err;
    cluster_worker_opts o;
    // fake router
    pd_loop *rl;
    pd_listener *rls;
    pd_conn *rc;
    int n_register;
    uint64_t router_id;      /* the identity REGISTER_ACK gives (0x7777; a restart: another) */
    uint32_t peer_decode_id; /* the id PEER gives the fake decode worker (DECODE_ID) */
    bool hold_peer;          /* REGISTER_ACK alone: the test sends PEER itself */
    int n_reject;
    uint64_t reject_req;
    uint32_t reject_reason;
    int n_pool_ack;
    uint64_t pool_req;
    pd_msg_pool_check_ack pack;
    // PROMPT_LP records at the fake router (one echo request at a time)
    uint64_t lp_req;
    uint32_t lp_next;     /* next position expected */
    int lp_msgs, lp_done; /* messages, LAST messages */
    int32_t lp_tok[N_CTX];
    float lp_lp[N_CTX];
    pd_msg_top lp_top[N_CTX][2];
    uint32_t lp_n_top;
    // fake decode
    pd_loop *dl;
    pd_listener *dls;
    pd_conn *dc;
    uint32_t link_from; /* prefill id in LINK */
    uint64_t link_router; /* router identity in LINK */
    uint64_t epoch;     /* of the current data link */
    int n_links;        /* LINK frames seen */
    kv_pool *dpool;
    pd_recv *r;
    logged log[1024];  /* data-link frames from prefill */
    int n_log;
    int n_commit, n_finish;
    uint64_t commit_req;
    int32_t first_token;
    uint32_t commit_n_top;
    uint64_t finish_req;
    uint32_t finish_kind;
} harness;

static harness H;

static void *worker_main(void *arg) {
    harness *h = arg;
    ks_errbuf eb;
    h->run_err = cluster_prefill_run(&h->o, &h->stop, &eb);
    if (h->run_err) fprintf(stderr, "cluster_prefill_run: %s\n", eb.msg);
    return NULL;
}

static void send_frame(pd_conn *c, uint16_t type, uint64_t req_id, const uint8_t *p, uint32_t len) {
    struct iovec iov = {(void *)p, len};
    CHECK(c);
    CHECK_EQ(pd_conn_send(c, type, req_id, &iov, len ? 1 : 0, NULL), KS_OK);
}

// -- fake router

/* PEER naming the fake decode worker as decode_id. */
static void send_peer(pd_conn *c, uint32_t decode_id) {
    uint8_t buf[300];
    uint32_t len;
    pd_msg_peer p = {.decode_worker_id = decode_id, .port = pd_listener_port(H.dls),
                     .host = "127.0.0.1", .host_len = 9};
    CHECK_EQ(pd_msg_peer_encode(&p, buf, sizeof buf, &len, NULL), KS_OK);
    send_frame(c, PD_MSG_PEER, 0, buf, len);
}

static void r_open(pd_conn *c, void *ud) {
    harness *h = ud;
    h->rc = c;
}

static void r_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    uint8_t buf[300];
    uint32_t len;
    switch (f->hdr.type) {
    case PD_MSG_REGISTER: {
        pd_msg_register m;
        CHECK_EQ(pd_msg_register_decode(f->payload, f->payload_len, &m, NULL), KS_OK);
        CHECK_EQ(m.role, PD_ROLE_PREFILL);
        CHECK_EQ(m.n_layer, (uint32_t)h->g.n_layer);
        CHECK_EQ(m.kv_dim, (uint32_t)h->g.kv_dim);
        CHECK_EQ(m.kv_type, (uint32_t)h->g.kv_type);
        CHECK_EQ(m.page_tokens, PAGE_TOKENS);
        CHECK_EQ(m.n_pages, PRE_PAGES);
        CHECK_EQ(m.n_ctx, N_CTX);
        h->n_register++;
        pd_msg_register_ack a = {.worker_id = PREFILL_ID, .health_interval_ms = 1000,
                                 .router_id = h->router_id};
        CHECK_EQ(pd_msg_register_ack_encode(&a, buf, sizeof buf, &len, NULL), KS_OK);
        send_frame(c, PD_MSG_REGISTER_ACK, 0, buf, len);
        if (!h->hold_peer) send_peer(c, h->peer_decode_id);
        break;
    }
    case PD_MSG_REJECT: {
        pd_msg_reject rj;
        CHECK_EQ(pd_msg_reject_decode(f->payload, f->payload_len, &rj, NULL), KS_OK);
        h->n_reject++;
        h->reject_req = f->hdr.req_id;
        h->reject_reason = rj.reason;
        break;
    }
    case PD_MSG_POOL_CHECK_ACK:
        CHECK_EQ(pd_msg_pool_check_ack_decode(f->payload, f->payload_len, &h->pack, NULL), KS_OK);
        h->pool_req = f->hdr.req_id;
        h->n_pool_ack++;
        break;
    case PD_MSG_HEALTH_ACK:
        break;
    case PD_MSG_PROMPT_LP: {
        pd_msg_prompt_lp m;
        CHECK_EQ(pd_msg_prompt_lp_decode(f->payload, f->payload_len, &m, NULL), KS_OK);
        CHECK_EQ(f->hdr.req_id, h->lp_req);
        CHECK_EQ(h->lp_done, 0);           // nothing after LAST
        CHECK_EQ(m.first_pos, h->lp_next); // in position order, no gap
        CHECK(m.first_pos + m.n_records <= N_CTX);
        CHECK(m.n_top <= 2);
        h->lp_n_top = m.n_top;
        for (uint32_t i = 0; i < m.n_records; i++) {
            uint32_t pos = m.first_pos + i;
            pd_msg_prompt_lp_record(&m, i, &h->lp_tok[pos], &h->lp_lp[pos]);
            for (uint32_t k = 0; k < m.n_top; k++)
                h->lp_top[pos][k] = pd_msg_prompt_lp_top(&m, i, k);
        }
        h->lp_next += m.n_records;
        h->lp_msgs++;
        if (m.flags & PD_PROMPT_LP_LAST) h->lp_done++;
        break;
    }
    default:
        fprintf(stderr, "router got %s\n", pd_msg_type_name(f->hdr.type));
        CHECK(!"unexpected frame at the fake router");
    }
}

static void r_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)why;
    (void)msg;
    if (h->rc == c) h->rc = NULL;
}

// -- fake decode: a real pd_recv behind the data listener

static void d_ev(void *ctx, const pd_recv_ev *ev) {
    harness *h = ctx;
    switch (ev->kind) {
    case PD_RECV_EV_ABORT: {
        pd_msg_abort a = {.reason = ev->abort_reason};
        uint8_t buf[4];
        uint32_t len;
        CHECK_EQ(pd_msg_abort_encode(&a, buf, sizeof buf, &len, NULL), KS_OK);
        if (h->dc && ev->link_epoch == EPOCH) send_frame(h->dc, PD_MSG_ABORT, ev->req_id, buf, len);
        break;
    }
    case PD_RECV_EV_FINISH:
        h->n_finish++;
        h->finish_req = ev->req_id;
        h->finish_kind = ev->finish;
        break;
    case PD_RECV_EV_COMMIT:
        h->n_commit++;
        h->commit_req = ev->req_id;
        h->first_token = ev->done->first_token;
        h->commit_n_top = ev->done->n_top;
        break;
    case PD_RECV_EV_TEARDOWN:
        CHECK(!"T_ack expired in the test");
    }
}

static void d_log(harness *h, uint16_t type, uint64_t req_id) {
    CHECK(h->n_log < 1024);
    h->log[h->n_log++] = (logged){type, req_id};
}

static ks_err d_sink(pd_conn *c, void *ud, const pd_frame_hdr *hdr, const uint8_t *prefix,
                     uint32_t prefix_len, struct iovec *iov, int *n_iov) {
    harness *h = ud;
    (void)c;
    *n_iov = 0;
    if (hdr->type != PD_MSG_KV_PAGE) return KS_OK;
    pd_msg_kv_page kp;
    ks_errbuf eb;
    if (pd_msg_kv_page_decode(prefix, prefix_len, hdr->len, &h->g, &kp, &eb) != KS_OK)
        return KS_ERR_PROTO;
    if (!pd_recv_kv_page_begin(h->r, hdr->req_id, EPOCH, &kp, iov, PD_MAX_IOV, n_iov)) *n_iov = 0;
    return KS_OK;
}

static void d_sink_fail(pd_conn *c, void *ud, const pd_frame_hdr *hdr, ks_err why) {
    harness *h = ud;
    (void)c;
    (void)why;
    pd_recv_kv_page_end(h->r, hdr->req_id, false);
}

static void d_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    uint64_t id = f->hdr.req_id;
    switch (f->hdr.type) {
    case PD_MSG_LINK: {
        pd_msg_link lk;
        CHECK_EQ(pd_msg_link_decode(f->payload, f->payload_len, &lk, NULL), KS_OK);
        uint8_t mid[32]; // LINK names the model the prefill worker serves (issue 40)
        cluster_model_id(h->m, mid);
        CHECK(memcmp(lk.model_id, mid, sizeof mid) == 0);
        h->link_from = lk.prefill_worker_id;
        h->link_router = lk.router_id;
        h->dc = c;
        h->n_links++;
        h->epoch = 76u + (uint64_t)h->n_links;
        pd_msg_link_ack a = {.link_epoch = EPOCH};
        uint8_t buf[8];
        uint32_t len;
        CHECK_EQ(pd_msg_link_ack_encode(&a, buf, sizeof buf, &len, NULL), KS_OK);
        send_frame(c, PD_MSG_LINK_ACK, 0, buf, len);
        return;
    }
    case PD_MSG_KV_PAGE:
        d_log(h, f->hdr.type, id);
        if (f->sunk) pd_recv_kv_page_end(h->r, id, true);
        return;
    case PD_MSG_DONE: {
        d_log(h, f->hdr.type, id);
        pd_msg_done d;
        CHECK_EQ(pd_msg_done_decode(f->payload, f->payload_len, &d, NULL), KS_OK);
        (void)pd_recv_done(h->r, id, EPOCH, &d);
        return;
    }
    case PD_MSG_REJECT:
        d_log(h, f->hdr.type, id);
        pd_msg_reject rj;
        CHECK_EQ(pd_msg_reject_decode(f->payload, f->payload_len, &rj, NULL), KS_OK);
        pd_recv_reject(h->r, id, EPOCH, rj.reason, NULL);
        return;
    case PD_MSG_ABORT:
        d_log(h, f->hdr.type, id);
        pd_recv_prefill_abort(h->r, id, EPOCH);
        return;
    case PD_MSG_ABORT_ACK:
        d_log(h, f->hdr.type, id);
        pd_recv_abort_ack(h->r, id, EPOCH);
        return;
    default:
        fprintf(stderr, "decode got %s\n", pd_msg_type_name(f->hdr.type));
        CHECK(!"unexpected frame at the fake decode");
    }
}

static void d_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)why;
    (void)msg;
    if (h->dc == c) {
        h->dc = NULL;
        (void)pd_recv_link_closed(h->r, h->epoch);
    }
}

static pd_loop *mkloop(uint8_t role) {
    pd_loop_cfg cfg = {.secret = SECRET, .secret_len = sizeof SECRET, .role = role,
                       .max_payload = PD_MSG_MAX_FRAME};
    pd_loop *l = NULL;
    CHECK_EQ(pd_loop_create(&cfg, &l, NULL), KS_OK);
    return l;
}

/* Drives both fake loops for up to ms or until *flag >= want. */
static bool run_until(const int *flag, int want, int ms) {
    uint64_t end = cl_now_ms(NULL) + (uint64_t)ms;
    while (cl_now_ms(NULL) < end) {
        if (flag && *flag >= want) return true;
        CHECK_EQ(pd_loop_run_once(H.rl, 1), KS_OK);
        CHECK_EQ(pd_loop_run_once(H.dl, 1), KS_OK);
        (void)pd_recv_tick(H.r);
    }
    return flag ? *flag >= want : true;
}

static int count_log(uint64_t req_id, uint16_t type) {
    int n = 0;
    for (int i = 0; i < H.n_log; i++) n += H.log[i].req_id == req_id && H.log[i].type == type;
    return n;
}

static int last_log(uint64_t req_id) {
    for (int i = H.n_log - 1; i >= 0; i--)
        if (H.log[i].req_id == req_id) return i;
    return -1;
}

static int32_t tok_of(uint32_t i) { return (int32_t)(5u + (i * 37u) % 200u); }

static uint32_t g_flags; /* extra sampling flags of the next start_request (PD_FLAG_PROMPT_LP) */

/* The router's part of a request: ADMIT on the fake decode (grant bound to
 * link_epoch), then PREFILL to the worker. */
static void start_request(uint64_t req_id, uint32_t n_prompt, uint32_t max_tokens, uint64_t epoch) {
    uint8_t mid[32];
    cluster_model_id(H.m, mid);
    pd_recv_admit_args a = {.n_prompt = n_prompt, .max_tokens = max_tokens,
                            .prefill_worker_id = PREFILL_ID, .link_epoch = epoch,
                            .model_id = mid};
    const uint8_t *grant;
    uint32_t grant_len, deny;
    ks_errbuf eb;
    ks_err e = pd_recv_admit(H.r, req_id, &a, &grant, &grant_len, &deny, &eb);
    if (e) fprintf(stderr, "admit: %s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
    int32_t toks[N_CTX * 2];
    for (uint32_t i = 0; i < n_prompt; i++) toks[i] = tok_of(i);
    sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0.0f; // greedy
    sp.n_probs = 2;
    sp.logprobs = true;
    pd_msg_prefill m = {.decode_worker_id = DECODE_ID, .n_prompt = n_prompt, .grant = grant,
                        .grant_len = grant_len};
    char msg[128];
    CHECK(cl_sampling_to_msg(&sp, (int32_t)max_tokens, false, NULL, 0, NULL, 0, &m.s, msg,
                             sizeof msg));
    m.s.flags |= g_flags;
    static uint8_t buf[1 << 16];
    uint32_t len;
    CHECK_EQ(pd_msg_prefill_encode(&m, toks, buf, sizeof buf, &len, NULL), KS_OK);
    send_frame(H.rc, PD_MSG_PREFILL, req_id, buf, len);
}

// ----------------------------------------------------------------------------
// Reference: the prompt's KV and logits from a local model_forward

/* A local reference of the prompt tok_of(0..n-1): its own pool, context and
 * sequence, one model_forward of all n positions; the logits of the last
 * position (all_rows false) or of every position (true, n rows). */
typedef struct {
    kv_pool *pool;
    model_ctx *ctx;
    kv_seq s;
    float *logits;
    int32_t V;
} local_ref;

static void local_forward(local_ref *r, uint32_t n, bool all_rows) {
    CHECK_EQ(kv_pool_create(&H.g, DEC_PAGES, KV_SCRUB_ZERO, &r->pool, NULL), KS_OK);
    CHECK_EQ(model_ctx_create(H.m, r->pool, 1, N_CTX, N_CTX, &r->ctx, NULL), KS_OK);
    kv_seq_init(r->pool, &r->s);
    CHECK_EQ(kv_seq_reserve(r->pool, &r->s, n, NULL), KS_OK);
    int32_t tok[N_CTX], pos[N_CTX], seq[N_CTX], out[N_CTX];
    for (uint32_t i = 0; i < n; i++) {
        tok[i] = tok_of(i);
        pos[i] = (int32_t)i;
        seq[i] = 0;
        out[i] = all_rows ? (int32_t)i : i == n - 1 ? 0 : -1;
    }
    kv_seq *seqs[1] = {&r->s};
    model_batch b = {.n_tokens = (int32_t)n,
                     .tokens = tok,
                     .pos = pos,
                     .seq = seq,
                     .out_row = out,
                     .n_out = all_rows ? (int32_t)n : 1,
                     .n_seqs = 1,
                     .seqs = seqs};
    r->V = model_hp(H.m)->n_vocab;
    r->logits = malloc((size_t)b.n_out * (size_t)r->V * sizeof *r->logits);
    CHECK(r->logits);
    CHECK_EQ(model_forward(r->ctx, &b, r->logits, NULL), KS_OK);
    kv_seq_set_filled(r->pool, &r->s, n);
}

static void local_free(local_ref *r) {
    free(r->logits);
    kv_seq_release(r->pool, &r->s);
    model_ctx_free(r->ctx);
    kv_pool_destroy(r->pool);
}

static void check_kv_and_first_token(uint64_t req_id, uint32_t n) {
    local_ref r;
    local_forward(&r, n, false);
    int32_t best = 0;
    for (int32_t i = 1; i < r.V; i++)
        if (r.logits[i] > r.logits[best]) best = i;
    CHECK_EQ(H.first_token, best);

    kv_seq *q = pd_recv_seq(H.r, req_id);
    CHECK(q);
    size_t row_bytes = kv_row_bytes(&H.g);
    for (uint32_t pg = 0; pg * PAGE_TOKENS < n; pg++) {
        uint32_t rows = n - pg * PAGE_TOKENS < PAGE_TOKENS ? n - pg * PAGE_TOKENS : PAGE_TOKENS;
        for (int l = 0; l < H.g.n_layer; l++) {
            const void *k0, *v0, *k1, *v1;
            CHECK_EQ(kv_seq_span_read(r.pool, &r.s, pg, l, rows, &k0, &v0), KS_OK);
            CHECK_EQ(kv_seq_span_read(H.dpool, q, pg, l, rows, &k1, &v1), KS_OK);
            CHECK_MEM_EQ(k0, k1, rows * row_bytes);
            CHECK_MEM_EQ(v0, v1, rows * row_bytes);
        }
    }
    local_free(&r);
}

/* The prompt records of an n-token prompt against a local model_forward
 * of all n positions at once: record i is tok_of(i) under row i-1, with
 * its 2 alternatives, bit for bit (batch invariance: the worker chunked). */
static void check_prompt_records(uint32_t n) {
    local_ref r;
    local_forward(&r, n, true);
    CHECK_EQ(H.lp_next, n);
    CHECK_EQ(H.lp_n_top, 2);
    for (uint32_t i = 1; i < n; i++) {
        sample_result sr;
        memset(&sr, 0, sizeof sr);
        sample_logprobs_row(r.logits + (size_t)(i - 1) * (size_t)r.V, r.V, tok_of(i), 2, &sr);
        CHECK_EQ(H.lp_tok[i], tok_of(i));
        CHECK_MEM_EQ(&H.lp_lp[i], &sr.logprob, sizeof(float));
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(H.lp_top[i][k].id, sr.top_ids[k]);
            CHECK_MEM_EQ(&H.lp_top[i][k].logprob, &sr.top_logprobs[k], sizeof(float));
        }
    }
    local_free(&r);
}

// ----------------------------------------------------------------------------
// Cases (run in order on one worker)

/* 13 prompt tokens over 4 pages, computed in chunks of 5: decode commits the
 * exact local KV, DONE carries the greedy token, DONE is the last frame. */
static void case_happy(void) {
    fprintf(stderr, "-- happy\n");
    int before = H.n_commit;
    start_request(101, 13, 4, EPOCH);
    CHECK(run_until(&H.n_commit, before + 1, TEST_WAIT_MS));
    CHECK_EQ(H.commit_req, 101);
    CHECK_EQ(pd_recv_state_of(H.r, 101), PD_RECV_COMMITTED);
    CHECK_EQ(count_log(101, PD_MSG_KV_PAGE), 4);
    CHECK_EQ(count_log(101, PD_MSG_DONE), 1);
    CHECK_EQ(H.log[last_log(101)].type, PD_MSG_DONE);
    CHECK_EQ(H.commit_n_top, 2);
    check_kv_and_first_token(101, 13);
    pd_recv_finish(H.r, 101);
    CHECK_EQ(H.n_reject, 0);
}

/* Echo (PD_FLAG_PROMPT_LP) over case_happy's 13-token prompt, whose three
 * full pages the worker's prefix cache now holds: computed in full anyway,
 * records for positions 1..12 in forward-chunk messages (5 positions each)
 * with LAST on the third, equal to a local forward's; the KV and first
 * token as without echo. Then a one-token prompt: one empty LAST. */
static void case_prompt_lp(void) {
    fprintf(stderr, "-- prompt_lp\n");
    int before = H.n_commit;
    H.lp_req = 108;
    H.lp_next = 1;
    H.lp_msgs = H.lp_done = 0;
    g_flags = PD_FLAG_PROMPT_LP;
    start_request(108, 13, 4, EPOCH);
    CHECK(run_until(&H.n_commit, before + 1, TEST_WAIT_MS));
    CHECK(run_until(&H.lp_done, 1, TEST_WAIT_MS));
    CHECK_EQ(H.commit_req, 108);
    CHECK_EQ(H.lp_msgs, 3);
    check_prompt_records(13);
    check_kv_and_first_token(108, 13);
    pd_recv_finish(H.r, 108);

    before = H.n_commit;
    H.lp_req = 109;
    H.lp_next = 1;
    H.lp_msgs = H.lp_done = 0;
    start_request(109, 1, 2, EPOCH);
    CHECK(run_until(&H.n_commit, before + 1, TEST_WAIT_MS));
    CHECK(run_until(&H.lp_done, 1, TEST_WAIT_MS));
    CHECK_EQ(H.lp_msgs, 1);
    CHECK_EQ(H.lp_next, 1); // no record: position 0 has no logprob
    pd_recv_finish(H.r, 109);
    g_flags = 0;
    CHECK_EQ(H.n_reject, 0);
}

/* I4: n_prompt + max_tokens > n_ctx: REJECT CONTEXT to the router and to
 * decode, no KV_PAGE, no DONE. */
static void case_reject_context(void) {
    fprintf(stderr, "-- reject_context\n");
    int rejects = H.n_reject;
    start_request(102, 20, N_CTX, EPOCH); // decode (n_ctx unlimited here) grants it
    CHECK(run_until(&H.n_reject, rejects + 1, TEST_WAIT_MS));
    run_until(NULL, 0, 100);
    CHECK_EQ(H.reject_req, 102);
    CHECK_EQ(H.reject_reason, ADMIT_CONTEXT_LENGTH);
    CHECK_EQ(count_log(102, PD_MSG_REJECT), 1);
    CHECK_EQ(count_log(102, PD_MSG_KV_PAGE), 0);
    CHECK_EQ(count_log(102, PD_MSG_DONE), 0);
    CHECK_EQ(pd_recv_state_of(H.r, 102), PD_RECV_FREED); // F3
}

/* I4: a grant bound to another link epoch (stale): REJECT STALE_GRANT to the
 * router, nothing on the link at all. */
static void case_reject_stale(void) {
    fprintf(stderr, "-- reject_stale\n");
    int rejects = H.n_reject;
    start_request(103, 6, 4, EPOCH + 1000);
    CHECK(run_until(&H.n_reject, rejects + 1, TEST_WAIT_MS));
    run_until(NULL, 0, 100);
    CHECK_EQ(H.reject_req, 103);
    CHECK_EQ(H.reject_reason, ADMIT_STALE_GRANT);
    CHECK_EQ(last_log(103), -1);
    (void)pd_recv_link_closed(H.r, EPOCH + 1000); // that "link" is gone: F5 frees the grant
    CHECK_EQ(pd_recv_state_of(H.r, 103), PD_RECV_FREED);
}

/* Router ABORT right after PREFILL (to decode and prefill, as the router
 * does): the last frame for the request on the link is ABORT_ACK, no DONE,
 * and decode frees the quarantined pages by F4. */
static void case_router_abort(void) {
    fprintf(stderr, "-- router_abort\n");
    start_request(104, 60, 4, EPOCH);
    pd_msg_abort a = {.reason = PD_ABORT_CLIENT_GONE};
    uint8_t buf[4];
    uint32_t len;
    CHECK_EQ(pd_msg_abort_encode(&a, buf, sizeof buf, &len, NULL), KS_OK);
    send_frame(H.rc, PD_MSG_ABORT, 104, buf, len);
    CHECK(pd_recv_abort(H.r, 104, PD_ABORT_CLIENT_GONE)); // ABORTING: ABORT on the link
    CHECK_EQ(pd_recv_state_of(H.r, 104), PD_RECV_ABORTING);
    uint64_t end = cl_now_ms(NULL) + TEST_WAIT_MS;
    while (pd_recv_state_of(H.r, 104) != PD_RECV_FREED && cl_now_ms(NULL) < end)
        run_until(NULL, 0, 10);
    run_until(NULL, 0, 200); // a second ACK (one per ABORT) may follow
    CHECK_EQ(pd_recv_state_of(H.r, 104), PD_RECV_FREED);
    CHECK(count_log(104, PD_MSG_ABORT_ACK) >= 1);
    CHECK_EQ(count_log(104, PD_MSG_DONE), 0);
    CHECK_EQ(H.log[last_log(104)].type, PD_MSG_ABORT_ACK);
    fprintf(stderr, "   %d KV_PAGE frames before the ABORT_ACK\n", count_log(104, PD_MSG_KV_PAGE));
}

/* Decode aborts (as on T_grant or a client gone seen by decode) right after
 * the router's PREFILL: the ABORT on the data link reaches pd_send, in either
 * order with the PREFILL, and ABORT_ACK is the last frame (F4). */
static void case_decode_abort(void) {
    fprintf(stderr, "-- decode_abort\n");
    start_request(105, 40, 4, EPOCH);
    CHECK(pd_recv_abort(H.r, 105, PD_ABORT_TIMEOUT));
    uint64_t end = cl_now_ms(NULL) + TEST_WAIT_MS;
    while (pd_recv_state_of(H.r, 105) != PD_RECV_FREED && cl_now_ms(NULL) < end)
        run_until(NULL, 0, 10);
    run_until(NULL, 0, 200);
    CHECK_EQ(pd_recv_state_of(H.r, 105), PD_RECV_FREED);
    CHECK_EQ(count_log(105, PD_MSG_ABORT_ACK), 1);
    CHECK_EQ(H.log[last_log(105)].type, PD_MSG_ABORT_ACK);
}

/* POOL_CHECK: nothing in flight, every local page free and scrubbed. */
static void case_pool_check(void) {
    fprintf(stderr, "-- pool_check\n");
    send_frame(H.rc, PD_MSG_POOL_CHECK, 555, NULL, 0);
    CHECK(run_until(&H.n_pool_ack, 1, TEST_WAIT_MS));
    CHECK_EQ(H.pool_req, 555);
    CHECK_EQ(H.pack.clean, 1);
    CHECK_EQ(H.pack.active, 0);
    CHECK_EQ(H.pack.free_pages, PRE_PAGES);
    CHECK_EQ(H.pack.allocated, 0);
    CHECK_EQ(H.pack.ready, 0);
    CHECK_EQ(H.pack.quarantined, 0);
}

/* Decode closes the data link: prefill reconnects (new epoch) while the
 * router still lists the decode worker, and the next request runs on it. */
static void case_relink(void) {
    fprintf(stderr, "-- relink\n");
    uint64_t old = H.epoch;
    pd_conn_close(H.dc);
    CHECK(run_until(&H.n_links, 2, TEST_WAIT_MS));
    CHECK(H.epoch != old);
    run_until(NULL, 0, 200); // LINK_ACK reaches the worker
    int rejects = H.n_reject;
    start_request(106, 9, 3, old); // a grant of the dead link: STALE_GRANT
    CHECK(run_until(&H.n_reject, rejects + 1, TEST_WAIT_MS));
    CHECK_EQ(H.reject_req, 106);
    CHECK_EQ(H.reject_reason, ADMIT_STALE_GRANT);
    (void)pd_recv_link_closed(H.r, old);
    int before = H.n_commit;
    start_request(107, 9, 3, H.epoch);
    CHECK(run_until(&H.n_commit, before + 1, TEST_WAIT_MS));
    CHECK_EQ(H.commit_req, 107);
    check_kv_and_first_token(107, 9);
    pd_recv_finish(H.r, 107);
}

/* The router restarts (a new identity) and numbers the decode worker
 * otherwise: the link opened under its predecessor's registration is closed
 * and not re-dialed under the new identity before a PEER of the new
 * registration names the decode worker (it would be a second link from this
 * worker to that decode worker, which decode refuses, or which the sync then
 * retires while grants name it: tests/e2e/test_fleet.sh); the PEER's link
 * is the one link that comes up. */
static void case_router_restart(void) {
    fprintf(stderr, "-- router restart\n");
    int regs = H.n_register, links = H.n_links;
    H.router_id = 0x8888;
    H.hold_peer = true;
    pd_conn_close(H.rc);
    CHECK(run_until(&H.n_register, regs + 1, TEST_WAIT_MS));
    run_until(NULL, 0, 600); // a re-dial of the old link would come after 100 ms
    CHECK_EQ(H.n_links, links);
    CHECK(H.rc);
    send_peer(H.rc, DECODE_ID + 1);
    CHECK(run_until(&H.n_links, links + 1, TEST_WAIT_MS));
    CHECK_EQ(H.link_router, 0x8888);
    CHECK_EQ(H.link_from, PREFILL_ID);
    run_until(NULL, 0, 600);
    CHECK_EQ(H.n_links, links + 1);
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
    H.router_id = 0x7777;
    H.peer_decode_id = DECODE_ID;
    ks_errbuf eb;
    if (model_load(path, &H.m, &eb) != KS_OK) {
        fprintf(stderr, "model_load: %s\n", eb.msg);
        CHECK(!"model_load");
    }
    engine_opts d; // pages travel in the engine's default KV type (f16)
    engine_opts_default(&d);
    H.g = model_kv_geom(H.m, PAGE_TOKENS, d.kv_type);

    // fake decode: pool, receiver, data listener
    CHECK_EQ(kv_pool_create(&H.g, DEC_PAGES, KV_SCRUB_ZERO, &H.dpool, NULL), KS_OK);
    pd_recv_cfg rc = {.n_ctx = 0, .emit = d_ev, .emit_ctx = &H};
    cluster_model_id(H.m, rc.model_id); // its grants carry the model (the worker checks it)
    CHECK_EQ(pd_recv_create(H.dpool, &rc, &H.r, NULL), KS_OK);
    H.dl = mkloop(PD_ROLE_DECODE);
    pd_conn_cbs dcbs = {.on_frame = d_frame, .sink = d_sink, .sink_prefix = PD_MSG_KV_PAGE_HDR,
                        .on_sink_fail = d_sink_fail, .on_close = d_close,
                        .peer_roles = 1u << PD_ROLE_PREFILL};
    CHECK_EQ(pd_tcp_listen(H.dl, "127.0.0.1", 0, &dcbs, &H, &H.dls, NULL), KS_OK);
    // fake router
    H.rl = mkloop(PD_ROLE_ROUTER);
    pd_conn_cbs rcbs = {.on_open = r_open, .on_frame = r_frame, .on_close = r_close,
                        .peer_roles = 1u << PD_ROLE_PREFILL};
    CHECK_EQ(pd_tcp_listen(H.rl, "127.0.0.1", 0, &rcbs, &H, &H.rls, NULL), KS_OK);

    // the worker
    H.o.m = H.m;
    H.o.secret = SECRET;
    H.o.secret_len = sizeof SECRET;
    H.o.router_host = "127.0.0.1";
    H.o.router_port = pd_listener_port(H.rls);
    H.o.t_router_ms = 10 * TEST_WAIT_MS; // the fake router sends no HEALTH
    engine_opts_default(&H.o.eng);
    H.o.eng.m = H.m;
    H.o.eng.n_ctx = N_CTX;
    H.o.eng.kv_pages = PRE_PAGES;
    H.o.eng.page_tokens = PAGE_TOKENS;
    H.o.eng.n_threads = 1;
    H.o.eng.max_batch_tokens = 5; // the prompt is chunked
    CHECK_EQ(pthread_create(&H.th, NULL, worker_main, &H), 0);

    // registered, PEER sent, data link up (LINK from the registered id)
    CHECK(run_until(&H.n_register, 1, TEST_WAIT_MS));
    uint64_t end = cl_now_ms(NULL) + TEST_WAIT_MS;
    while (!H.dc && cl_now_ms(NULL) < end) run_until(NULL, 0, 10);
    CHECK(H.dc);
    CHECK_EQ(H.link_from, PREFILL_ID);
    run_until(NULL, 0, 200); // LINK_ACK reaches the worker before any PREFILL

    case_happy();
    case_prompt_lp();
    case_reject_context();
    case_reject_stale();
    case_router_abort();
    case_decode_abort();
    case_relink();
    case_pool_check();
    case_router_restart();

    atomic_store(&H.stop, 1);
    CHECK_EQ(pthread_join(H.th, NULL), 0);
    CHECK_EQ(H.run_err, KS_OK);
    run_until(NULL, 0, 100); // the closes reach the fakes
    pd_loop_destroy(H.rl);
    pd_loop_destroy(H.dl);
    pd_recv_destroy(H.r);
    CHECK(kv_pool_all_free_and_scrubbed(H.dpool));
    kv_pool_destroy(H.dpool);
    model_free(H.m);
    fprintf(stderr, "ok\n");
    return 0;
}
