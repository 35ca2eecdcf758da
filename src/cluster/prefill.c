/* prefill.c — the prefill worker (`kvseal prefill`, cluster.h): one pd_loop
 * on the calling thread carrying a control connection to each router
 * (ctrl.c) and one data link per (decode worker, router) each router names
 * (PEER; worker ids are a router's own numbering, so a decode worker known
 * to two routers gets two links, each LINK naming its router),
 * a local KV pool and model context, and a pd_send (pd_send.h) that
 * re-validates every PREFILL, computes the prompt's KV here, and pushes it
 * page by page to decode, followed by DONE with the first token.
 * Protocol: docs/pd-protocol.md sections 1, 5-9 (prefill side; F7 when the
 * router is lost: links keep serving ABORT/ABORT_ACK). */
#include "cluster_int.h"
#include "ucx_plane.h"

#include "kvseal/grammar.h"

#include "kvseal/admit.h"

#include "kvseal/pd_send.h"

#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_BACKOFF_MIN_MS 100u
#define PF_BACKOFF_MAX_MS 2000u
#define PF_CONNECT_TIMEOUT_MS 2000
#define PF_TICK_MS 50
#define PF_PUMP_BUDGET 8u                 /* KV_PAGE frames per loop iteration */
/* Pump only while no link has output queued: a KV page then goes from the
 * pool to the socket in one sendmsg, and only the part of one frame a full
 * socket refused is copied (a 4 MiB allowance once copied most pages twice:
 * into the queue, then into the socket). The socket's own buffer is the
 * pipeline. */
#define PF_PUMP_PENDING_MAX 0u
/* send_frame's AGAIN threshold: above any pending a gated pump can reach
 * (PF_PUMP_PENDING_MAX plus one maximal frame), so a queued frame is never
 * refused for back-pressure alone. */
#define PF_OUT_HIGH ((size_t)PF_PUMP_PENDING_MAX + 2u * (size_t)PD_MSG_MAX_FRAME)
/* Prompt positions per forward chunk of an echo request (PD_FLAG_PROMPT_LP):
 * each gets a logits row, and each chunk's records go out as one PROMPT_LP
 * (the engine's ENGINE__PROMPT_ROWS; the kernels are batch-invariant, so
 * the rows equal `kvseal serve`'s whatever the chunking). */
#define PF_LP_ROWS 64

/* pd_send's id for a decode worker: the router's index in the top 8 bits,
 * its id for the worker below (one router: the router's ids themselves). */
#define PF_KEY_ID_BITS 24u
#define PF_KEY(rt, decode_id) (((uint32_t)(rt) << PF_KEY_ID_BITS) | (uint32_t)(decode_id))
#define PF_KEY_NONE 0xFFFFFFFFu /* names no link: a grant for it is stale */

/* One router: its control connection (cl_ctrl's ud). */
typedef struct pf__rt {
    struct pf__worker *w;
    int idx;
    cl_ctrl *ctrl;
} pf__rt;

/* One decode worker a router named, and the data link to it. */
typedef struct pf__link {
    struct pf__worker *w;
    int rt;             /* the router (pf__worker.rts index) that named it */
    uint32_t decode_id; /* that router's id for the decode worker */
    uint32_t key;       /* PF_KEY(rt, decode_id): pd_send's id for it */
    uint64_t router_id; /* the router identity sent in LINK on conn */
    char host[PD_MSG_MAX_HOST + 1];
    uint16_t port;
    bool listed;        /* the router still names it (PEER with port != 0) */
    bool named;         /* a PEER named it since the latest registration (pf__on_synced) */
    pd_conn *conn;      /* NULL while waiting to reconnect */
    bool up;            /* LINK_ACK received: epoch valid, pd_send knows it */
    uint32_t link_id;   /* our worker id as sent in LINK on conn */
    bool closing;       /* conn is being closed: frames for it are dropped */
    uint64_t epoch;
    uint32_t backoff_ms;
    uint64_t next_attempt_ms;
} pf__link;

/* A pd_send call a frame asked for. Frame callbacks only queue them; the
 * main loop runs them in arrival order outside any callback, because a
 * PREFILL computes for a while and the loop is served between its forward
 * chunks (HEALTH must be answered), which is only safe at the top level. */
typedef enum pf__op_kind {
    PF_OP_PREFILL,
    PF_OP_ABORT,
    PF_OP_LINK_UP,
    PF_OP_LINK_CLOSED,
    PF_OP_EMBED
} pf__op_kind;
typedef struct pf__op {
    struct pf__op *next;
    pf__op_kind kind;
    uint64_t req_id;
    uint32_t decode_id; /* ABORT: 0 for the router's; else a link key (PF_KEY) */
    uint64_t epoch;     /* ABORT: PD_SEND_ROUTER for the router's */
    int rt;             /* PREFILL, EMBED: the router that sent it */
    uint32_t len;
    uint8_t payload[]; /* PREFILL, EMBED */
} pf__op;

typedef struct pf__worker {
    const cluster_worker_opts *o;
    const model *m;
    int32_t V;
    int32_t n_ctx;
    uint32_t page_tokens;
    pd_loop *loop;
    pf__rt rts[CLUSTER_MAX_ROUTERS];
    int n_rt;
    int cur_rt;           /* the router of the PREFILL or EMBED being handled (pf__op_run) */
    cl_health *health;    /* --health-port's endpoint, or NULL */
    kv_pool *pool;
    kv_prefix *prefix;    /* NULL with --no-prefix-cache; keyed by PREFILL's domain_hash (I7) */
    model_ctx *mctx;
    pd_send *send;
    cl_ucx *ucx;          /* --data-plane ucx, else NULL */
    float *logits;        /* (V) */
    grammar_vocab *gvocab; /* token trie, built at the first constrained request */
    uint32_t *gmask;       /* ((V + 31) / 32) grammar_sample's scratch */
    int32_t B;            /* forward chunk: max_batch_tokens */
    int32_t *b_tok, *b_pos, *b_seq, *b_out; /* (B) */
    pf__link **links;
    int n_links, cap_links;
    uint32_t router_tmax[PD_MSG_N_TYPES];
    uint32_t link_tmax[PD_MSG_N_TYPES];
    bool computing;          /* inside pd_send's compute: pd_send calls are deferred */
    bool draining;           /* stopping gracefully: new PREFILLs get REJECT DRAINING */
    uint8_t model_id[PD_MSG_HASH_BYTES]; /* cluster_model_id: in LINK, checked in grants */
    // one forward chunk runs on a compute thread while this thread serves the loop
    const model_batch *job;
    const model_hidden *job_hid; /* EMBED: the hidden rows the chunk hands out, else NULL */
    float *job_logits;           /* where the chunk's logits rows go (w->logits, w->lp_logits) */
    ks_err job_err;
    ks_errbuf job_eb;
    atomic_bool job_done;
    pf__op *ops, *ops_tail;  /* deferred pd_send calls, FIFO */
    // embeddings (EMBED, issue 13)
    model_pooling pooling; /* --pooling, or the model's */
    int32_t *b_hid;        /* (B) hidden row per token */
    float *hidden;         /* (B, n_embd) */
    double *eacc;          /* (n_embd) the pooled sum */
    float *evec;           /* (n_embd) the result */
    // prompt logprobs (echo, PD_FLAG_PROMPT_LP): allocated at the first such request
    uint64_t cur_req;       /* req_id of the PREFILL pd_send is handling (pf__op_run) */
    bool cur_lp;            /* that PREFILL asked for prompt logprobs (set by pf__admit) */
    uint8_t cur_domain[32]; /* that PREFILL's domain (set by pf__reserve): pf__compute's snapshot */
    float *lp_logits;       /* (PF_LP_ROWS, V) */
    int32_t *lp_tok;        /* (PF_LP_ROWS) */
    float *lp_lp;           /* (PF_LP_ROWS) */
    pd_msg_top *lp_top;     /* (PF_LP_ROWS, SAMPLE_MAX_TOP) */
    uint8_t *lp_buf;        /* one encoded PROMPT_LP of PF_LP_ROWS records */
    // LoRA adapters (--lora), each known by its digest (REGISTER, PD_FLAG_ADAPTER)
    int n_lora;
    uint8_t *lora_digest;         /* (n_lora, 32) */
    model_lora **lora;            /* (n_lora) loaded against m */
    const model_lora *cur_lora;   /* the adapter of the PREFILL being handled (pf__admit) */
    uint8_t cur_adapter[PD_MSG_ADAPTER_BYTES]; /* its digest (zero: none) */
} pf__worker;

/* The --lora adapters: each file read, digested and loaded against the
 * model (a file that does not fit refuses the start, named); the bytes are
 * scrubbed once loaded. */
static ks_err pf__adapters(pf__worker *w, ks_errbuf *eb) {
    const cluster_worker_opts *o = w->o;
    if (o->n_lora <= 0) return KS_OK;
    if (o->n_lora > (int)PD_MSG_MAX_ADAPTERS)
        return ks_seterr(eb, KS_ERR_INVAL, "at most %u --lora adapters", PD_MSG_MAX_ADAPTERS);
    w->lora = calloc((size_t)o->n_lora, sizeof *w->lora);
    w->lora_digest = calloc((size_t)o->n_lora, PD_MSG_ADAPTER_BYTES);
    if (!w->lora || !w->lora_digest) return ks_seterr(eb, KS_ERR_NOMEM, "adapters");
    for (int i = 0; i < o->n_lora; i++) {
        uint8_t *buf = NULL, *dig = w->lora_digest + (size_t)i * PD_MSG_ADAPTER_BYTES;
        size_t len = 0;
        ks_errbuf aeb;
        ks_errbuf_clear(&aeb);
        const float scale = o->lora[i].scale == 0.0f ? 1.0f : o->lora[i].scale;
        ks_err e = KS_OK;
        if (!(scale > -100.0f && scale < 100.0f)) // engine_adapter_add's bound
            e = ks_seterr(&aeb, KS_ERR_INVAL, "scale %g: must be in (-100, 100)", (double)scale);
        if (!e) e = cl_lora_read(&o->lora[i], &buf, &len, dig, &aeb);
        gguf_file *f = NULL;
        if (!e) e = gguf_open_mem(buf, len, o->lora[i].path, &f, &aeb);
        if (!e) e = model_lora_load_file(w->m, f, &w->lora[i], &aeb); // closes f
        if (buf) sodium_memzero(buf, len);
        free(buf);
        for (int j = 0; !e && j < i; j++)
            if (!memcmp(w->lora_digest + (size_t)j * PD_MSG_ADAPTER_BYTES, dig,
                        PD_MSG_ADAPTER_BYTES))
                e = ks_seterr(&aeb, KS_ERR_INVAL, "the same adapter is given twice");
        w->n_lora = i + 1; // (freed from here on)
        if (e) return ks_seterr(eb, e, "--lora %s: %s", o->lora[i].path, aeb.msg);
        model_lora_set_scale(w->lora[i], scale);
        char hex[2 * PD_MSG_ADAPTER_BYTES + 1];
        cl_hex(dig, PD_MSG_ADAPTER_BYTES, hex);
        ks_log(KS_LOG_INFO, "prefill worker: LoRA adapter %s (sha256 %s) loaded", o->lora[i].path,
               hex);
    }
    return KS_OK;
}

static void pf__op_run(pf__worker *w, pf__op *op);

/* Queues a pd_send call (see pf__op); returns it, or NULL (logged) when out of memory. */
static pf__op *pf__op_submit(pf__worker *w, pf__op_kind kind, int rt, uint64_t req_id,
                          uint32_t decode_id, uint64_t epoch, const uint8_t *payload, uint32_t len) {
    pf__op *op = malloc(sizeof *op + len);
    if (!op) {  // a PREFILL lost here times out at decode (T_grant) and at the router
        ks_log(KS_LOG_ERROR, "prefill worker: out of memory queueing request %" PRIu64, req_id);
        return NULL;
    }
    *op = (pf__op){.kind = kind, .req_id = req_id, .decode_id = decode_id, .epoch = epoch,
                   .rt = rt, .len = len};
    if (len) memcpy(op->payload, payload, len);
    if (w->ops_tail) w->ops_tail->next = op;
    else w->ops = op;
    w->ops_tail = op;
    return op;
}

static void pf__service(pf__worker *w);

/* Runs every router's reconnect back-off and T_router check. */
static void pf__ctrl_tick(pf__worker *w) {
    for (int i = 0; i < w->n_rt; i++) cl_ctrl_tick(w->rts[i].ctrl);
}

/* True when some router holds this worker registered (/ready). */
static bool pf__any_registered(const pf__worker *w) {
    for (int i = 0; i < w->n_rt; i++)
        if (cl_ctrl_registered(w->rts[i].ctrl)) return true;
    return false;
}

/* Sends to the router of the request being handled (w->cur_rt). */
static ks_err pf__router_send(pf__worker *w, uint16_t type, uint64_t req_id,
                              const struct iovec *iov, int n_iov, ks_errbuf *eb) {
    return cl_ctrl_send(w->rts[w->cur_rt].ctrl, type, req_id, iov, n_iov, eb);
}

/* Runs the queued pd_send calls, FIFO; main loop only (never in a callback,
 * never while computing). */
static void pf__ops_drain(pf__worker *w) {
    while (w->ops && !w->computing) {
        pf__op *o = w->ops;
        w->ops = o->next;
        if (!w->ops) w->ops_tail = NULL;
        bool prefill = o->kind == PF_OP_PREFILL || o->kind == PF_OP_EMBED;
        pf__op_run(w, o);
        free(o);
        if (prefill && w->ops) pf__service(w);  // a queue of prompts must not starve HEALTH either
    }
}

/* Serves the network for up to timeout_ms (we are at the top level of the
 * main loop, inside pf__ops_drain): HEALTH and POOL_CHECK are answered by
 * cl_ctrl; frames that need pd_send are queued (pf__op_submit). */
static void pf__service_for(pf__worker *w, int timeout_ms) {
    if (!w->loop) return;
    if (w->ucx) cl_ucx_progress(w->ucx);
    if (pd_loop_run_once(w->loop, timeout_ms) != KS_OK)
        ks_log(KS_LOG_WARN, "prefill worker: epoll_wait failed");
    pf__ctrl_tick(w);
    cl_health_beat(w->health, pf__any_registered(w), w->draining);  // live during long prompts
}

static void pf__service(pf__worker *w) { pf__service_for(w, 0); }

static void pf__wake(void *arg) { (void)arg; }  // posted by the compute thread: ends the wait

static void *pf__forward_thread(void *arg) {
    pf__worker *w = arg;
    ks_errbuf_clear(&w->job_eb);
    w->job_err = model_forward_hidden(w->mctx, w->job, w->job_logits, w->job_hid, &w->job_eb);
    atomic_store(&w->job_done, true);
    if (pd_loop_post(w->loop, pf__wake, NULL) != KS_OK) {
        // no wake-up: the waiting loop still polls every 20 ms
    }
    return NULL;
}

/* One forward chunk on a compute thread while this (the loop's) thread keeps
 * answering HEALTH: a long prompt must not make the router drop a healthy
 * worker. The loop thread touches neither the model context nor the pool
 * meanwhile (pool_check reports busy). Without a loop (never in practice):
 * inline. */
static ks_err pf__forward(pf__worker *w, const model_batch *b, ks_errbuf *eb) {
    pthread_t th;
    w->job = b;
    if (!w->job_logits) w->job_logits = w->logits;
    atomic_store(&w->job_done, false);
    if (!w->loop || pthread_create(&th, NULL, pf__forward_thread, w) != 0)
        return model_forward_hidden(w->mctx, b, w->job_logits, w->job_hid, eb);
    while (!atomic_load(&w->job_done)) pf__service_for(w, 20);
    pthread_join(th, NULL);
    if (w->job_err) ks_seterr(eb, w->job_err, "%s", w->job_eb.msg);
    return w->job_err;
}

// ----------------------------------------------------------------------------
// Admission and the prefix-cache policy (pd_send's admit, reserve, computed)

/* The request contract (I4) on a PREFILL, as the router and `kvseal serve`
 * admit: lengths, token ids, sampling; the local pool must hold the prompt. */
static ks_err pf__admit(void *ctx, const int32_t *toks, uint32_t n, const pd_msg_sampling *msp,
                        ks_errbuf *eb) {
    pf__worker *w = ctx;
    engine_params p = {
        .prompt = toks, .n_prompt = (int32_t)n, .max_tokens = (int32_t)msp->max_tokens};
    if (msp->max_tokens > INT32_MAX) p.max_tokens = INT32_MAX;
    cl_sampling_from_msg(msp, &p.sp, &p.ignore_eos);
    admit_limits lim = {.n_ctx = w->n_ctx,
                        .n_vocab = w->V,
                        .page_tokens = w->page_tokens,
                        .max_pages = kv_pool_n_pages(w->pool),
                        .state_pages = (uint32_t)kv_pool_geom(w->pool)->state_pages,
                        .prompt_only = true};
    admit_admitted ad;
    ks_err e = admit_request(&lim, &p, &ad, eb);
    w->cur_lp = (msp->flags & PD_FLAG_PROMPT_LP) != 0; // for pf__reserve: no cache attach
    // the adapter the router resolved for the request's tenant, by digest
    static const uint8_t none[PD_MSG_ADAPTER_BYTES];
    w->cur_lora = NULL;
    memcpy(w->cur_adapter, msp->adapter, sizeof w->cur_adapter);
    for (int i = 0; i < w->n_lora && memcmp(msp->adapter, none, sizeof none); i++)
        if (!memcmp(w->lora_digest + (size_t)i * PD_MSG_ADAPTER_BYTES, msp->adapter,
                    PD_MSG_ADAPTER_BYTES))
            w->cur_lora = w->lora[i];
    if (!e && memcmp(msp->adapter, none, sizeof none) && !w->cur_lora) {
        char hex[2 * PD_MSG_ADAPTER_BYTES + 1];
        cl_hex(msp->adapter, PD_MSG_ADAPTER_BYTES, hex);
        e = admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND,
                         "the prefill worker holds no adapter %s (its --lora)", hex);
    }
    // the sampling extension, checked before any compute (I4)
    ks_errbuf xeb;
    sample_bias bias[PD_MSG_MAX_BIAS];
    int n_bias = cl_bias_from_msg(msp, bias);
    if (!e && sample_bias_validate(bias, n_bias, w->V, &xeb) != KS_OK)
        e = admit_refuse(eb, ADMIT_INVALID, "%s", xeb.msg);
    grammar *g = NULL;
    if (!e && msp->grammar_len && grammar_parse(msp->grammar, msp->grammar_len, &g, &xeb) != KS_OK)
        e = admit_refuse(eb, ADMIT_INVALID, "%s", xeb.msg);
    grammar_unref(g);
    return e;
}

/* Attaches the longest run of prompt pages cached under the request's
 * domain (I7: the tenant root the router derived from authentication, never
 * another's), then reserves the rest; cached pages nobody uses make room. */
static ks_err pf__reserve(void *ctx, kv_pool *pool, const uint8_t domain[32], const int32_t *toks,
                          uint32_t n, kv_seq *seq, ks_errbuf *eb) {
    pf__worker *w = ctx;
    // the cache key: the domain, mixed with the adapter's digest when there
    // is one (I7: no prefix passes between adapters, as in the engine)
    memcpy(w->cur_domain, domain, sizeof w->cur_domain);
    if (w->cur_lora) engine_root_with_adapter(w->cur_domain, w->cur_adapter);
    // echo computes every position (each needs its logits row), as the engine does
    if (w->prefix && !w->cur_lp) (void)kv_prefix_attach(w->prefix, w->cur_domain, toks, n, seq);
    ks_err e = kv_seq_reserve(pool, seq, n, eb);
    if (e == KS_ERR_NOSPACE && w->prefix) {
        uint32_t more = kv_seq_pages_needed(pool, seq, n), nfree = kv_pool_n_free(pool);
        if (more > nfree) kv_prefix_evict(w->prefix, more - nfree);
        e = kv_seq_reserve(pool, seq, n, eb);
    }
    if (e == KS_ERR_NOSPACE)
        return admit_refuse(eb, ADMIT_BUSY, "the prefill worker's KV cache is full");
    return e ? admit_refuse(eb, ADMIT_BUSY, "prefill worker: %s", eb ? eb->msg : "out of memory")
             : KS_OK;
}

/* The computed prompt's full pages go to the cache under its domain (a
 * hybrid model's went with their state, in pf__compute). */
static void pf__computed(void *ctx, kv_pool *pool, const uint8_t domain[32], const int32_t *toks,
                         uint32_t n, kv_seq *seq) {
    pf__worker *w = ctx;
    uint8_t root[32]; // as pf__reserve keyed it
    memcpy(root, domain, sizeof root);
    if (w->cur_lora) engine_root_with_adapter(root, w->cur_adapter);
    if (w->prefix && !kv_pool_geom(pool)->state_pages)
        kv_prefix_publish(w->prefix, root, toks, n, seq);
}

// ----------------------------------------------------------------------------
// Prompt logprobs (echo): PROMPT_LP records to the router

/* The echo buffers, at the first request that asks for them. */
static ks_err pf__lp_alloc(pf__worker *w, ks_errbuf *eb) {
    if (!w->lp_logits) w->lp_logits = malloc(sizeof(float) * PF_LP_ROWS * (size_t)w->V);
    if (!w->lp_tok) w->lp_tok = malloc(sizeof(int32_t) * PF_LP_ROWS);
    if (!w->lp_lp) w->lp_lp = malloc(sizeof(float) * PF_LP_ROWS);
    if (!w->lp_top) w->lp_top = malloc(sizeof(pd_msg_top) * PF_LP_ROWS * SAMPLE_MAX_TOP);
    if (!w->lp_buf)
        w->lp_buf =
            malloc(PD_MSG_PROMPT_LP_FIXED + PF_LP_ROWS * PD_MSG_PROMPT_LP_RECORD(SAMPLE_MAX_TOP));
    if (w->lp_logits && w->lp_tok && w->lp_lp && w->lp_top && w->lp_buf) return KS_OK;
    // what was allocated stays for the next request, and is freed with the worker
    return ks_seterr(eb, KS_ERR_NOMEM, "prompt logprobs: out of memory");
}

/* The forward chunk [off, off + chunk) of an n-token prompt has its logits
 * rows in w->lp_logits: sends the records of positions off+1 .. off+chunk
 * (those below n) in one PROMPT_LP, each token's logprob under the row of
 * the position before it, with n_probs alternatives, exactly as the
 * engine's prompt events (sample_logprobs_row). The last chunk carries
 * PD_PROMPT_LP_LAST, and its last row becomes w->logits, from which the
 * first token is sampled. The router gets every record before DONE leaves
 * for decode. A send that fails (the router is gone) is logged: the
 * request ends at the router anyway. */
static ks_err pf__lp_chunk(pf__worker *w, const int32_t *tokens, uint32_t n, uint32_t off,
                           uint32_t chunk, const pd_msg_sampling *msp, ks_errbuf *eb) {
    const size_t V = (size_t)w->V;
    const bool last = off + chunk == n;
    if (last) memcpy(w->logits, w->lp_logits + (size_t)(chunk - 1) * V, V * sizeof(float));
    int K = msp->n_probs < SAMPLE_MAX_TOP ? (int)msp->n_probs : SAMPLE_MAX_TOP;
    if (K > w->V) K = w->V;
    uint32_t n_rec = last ? chunk - 1 : chunk;
    for (uint32_t j = 0; j < n_rec; j++) {
        sample_result sr;
        memset(&sr, 0, sizeof sr);
        int32_t tok = tokens[off + j + 1];
        sample_logprobs_row(w->lp_logits + (size_t)j * V, w->V, tok, K, &sr);
        w->lp_tok[j] = tok;
        w->lp_lp[j] = sr.logprob;
        for (int k = 0; k < K; k++)
            w->lp_top[(size_t)j * (size_t)K + (size_t)k] =
                (pd_msg_top){.id = sr.top_ids[k], .logprob = sr.top_logprobs[k]};
    }
    pd_msg_prompt_lp m = {.first_pos = off + 1,
                          .n_records = n_rec,
                          .n_top = (uint32_t)K,
                          .flags = last ? PD_PROMPT_LP_LAST : 0};
    uint32_t len = 0;
    ks_err e = pd_msg_prompt_lp_encode(
        &m, w->lp_tok, w->lp_lp, w->lp_top, w->lp_buf,
        PD_MSG_PROMPT_LP_FIXED + PF_LP_ROWS * PD_MSG_PROMPT_LP_RECORD(SAMPLE_MAX_TOP), &len, eb);
    if (e) return e;
    struct iovec iov = {.iov_base = w->lp_buf, .iov_len = len};
    ks_errbuf seb;
    if (pf__router_send(w, PD_MSG_PROMPT_LP, w->cur_req, &iov, 1, &seb) != KS_OK)
        ks_log(KS_LOG_DEBUG, "request %" PRIu64 ": PROMPT_LP to the router dropped: %s", w->cur_req,
               seb.msg);
    return KS_OK;
}

// ----------------------------------------------------------------------------
// The forward pass and the first token (pd_send's compute)

static ks_err pf__compute(void *ctx, kv_pool *pool, kv_seq *seq, const int32_t *tokens, uint32_t n,
                          const pd_msg_sampling *msp, pd_send_first *out, ks_errbuf *eb) {
    pf__worker *w = ctx;
    sample_params sp;
    bool ignore_eos;
    cl_sampling_from_msg(msp, &sp, &ignore_eos);
    sampler *smp = NULL;
    sample_bias bias[PD_MSG_MAX_BIAS];
    int n_bias = cl_bias_from_msg(msp, bias);
    grammar *g = NULL;
    grammar_matcher *gm = NULL;
    ks_err e = sampler_create(&sp, w->V, &smp, eb);
    if (!e) e = sampler_set_bias(smp, bias, n_bias, eb);
    if (!e && msp->grammar_len) { // checked at admission (pf__admit)
        if (!w->gvocab) e = grammar_vocab_create(model_vocab(w->m), &w->gvocab, eb);
        if (!e && !w->gmask && !(w->gmask = malloc(((size_t)w->V + 31) / 32 * sizeof *w->gmask)))
            e = ks_seterr(eb, KS_ERR_NOMEM, "grammar mask");
        if (!e) e = grammar_parse(msp->grammar, msp->grammar_len, &g, eb);
        if (!e) e = grammar_matcher_create(g, &gm, eb);
        grammar_unref(g);
    }
    if (e != KS_OK) {
        grammar_matcher_destroy(gm);
        sampler_destroy(smp);
        return e;
    }
    kv_seq *seqs[1] = {seq};
    const bool lp = (msp->flags & PD_FLAG_PROMPT_LP) != 0;
    if (lp && !e) e = pf__lp_alloc(w, eb);
    if (lp && !e && seq->n_tokens != 0) // pf__reserve attaches nothing for echo
        e = ks_seterr(eb, KS_ERR_INTERNAL, "prompt logprobs: %u positions came from the cache",
                      seq->n_tokens);
    // a hybrid model's cache keeps the recurrent state at the last page
    // boundary before the last token (where an attach of this prompt ends):
    // the prefill stops there once (as the engine's does)
    const uint32_t snap_at = w->prefix && !lp && kv_pool_geom(pool)->state_pages > 0
                                 ? (n - 1) / w->page_tokens * w->page_tokens
                                 : 0;
    // positions below seq->n_tokens came from the prefix cache (pf__reserve)
    for (uint32_t off = seq->n_tokens; !e && off < n;) {
        int32_t chunk = n - off < (uint32_t)w->B ? (int32_t)(n - off) : w->B;
        if (lp && chunk > PF_LP_ROWS) chunk = PF_LP_ROWS;
        if (snap_at > off && off + (uint32_t)chunk > snap_at) chunk = (int32_t)(snap_at - off);
        int32_t n_out = 0;
        for (int32_t j = 0; j < chunk; j++) {
            uint32_t p = off + (uint32_t)j;
            w->b_tok[j] = tokens[p];
            w->b_pos[j] = (int32_t)p;
            w->b_seq[j] = 0;
            // logits only for the last prompt token, or (echo) for every position
            w->b_out[j] = lp || p == n - 1 ? n_out++ : -1;
        }
        const model_lora *lr[1] = {w->cur_lora};
        model_batch b = {.n_tokens = chunk, .tokens = w->b_tok, .pos = w->b_pos, .seq = w->b_seq,
                         .out_row = w->b_out, .n_out = n_out, .n_seqs = 1, .seqs = seqs,
                         .seq_err = NULL, .lora = w->cur_lora ? lr : NULL};
        w->job_logits = lp ? w->lp_logits : w->logits;
        e = pf__forward(w, &b, eb);
        w->job_logits = NULL;
        if (e == KS_OK && lp) e = pf__lp_chunk(w, tokens, n, off, (uint32_t)chunk, msp, eb);
        off += (uint32_t)chunk;
        if (e == KS_OK && off == snap_at)
            kv_prefix_publish_state(w->prefix, w->cur_domain, tokens, off, seq);
    }
    if (e != KS_OK) {
        grammar_matcher_destroy(gm);
        sampler_destroy(smp);
        return e;
    }
    // the first token exactly as `kvseal serve` samples it (engine__emit): a
    // fresh sampler over the last prompt position's logits
    sample_result sr;
    if (!gm) {
        if (!ignore_eos) engine_ban_eog(model_vocab(w->m), sp.min_tokens, 0, w->logits, w->V);
        sampler_sample(smp, w->logits, &sr);
    } else {
        bool end = false;
        e = grammar_sample(gm, w->gvocab, smp, &sp, w->logits, w->gmask, &sr, &end, eb);
        grammar_matcher_destroy(gm);
        if (e != KS_OK) {
            sampler_destroy(smp);
            return e;
        }
        if (end) { // complete, and nothing can follow: an EOG ends it at decode
            const tok_vocab *v = model_vocab(w->m);
            memset(&sr, 0, sizeof sr);
            sr.token = tok_eos(v) >= 0 ? tok_eos(v) : tok_eot(v);
            if (sr.token < 0) {
                sampler_destroy(smp);
                return ks_seterr(eb, KS_ERR_INVAL,
                                 "grammar: complete, and the vocabulary has "
                                 "no end-of-generation token to end on");
            }
        }
    }
    memset(out, 0, sizeof *out);
    out->first_token = sr.token;
    out->logprob = sr.logprob;
    out->n_top = sr.n_top > 0 ? (uint32_t)sr.n_top : 0;
    if (out->n_top > PD_MSG_MAX_TOP) out->n_top = PD_MSG_MAX_TOP;
    for (uint32_t i = 0; i < out->n_top; i++)
        out->top[i] = (pd_msg_top){.id = sr.top_ids[i], .logprob = sr.top_logprobs[i]};
    out->rng_state = sampler_draws(smp);
    sampler_destroy(smp);
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Embeddings (EMBED -> EMBED_RESULT or REJECT, docs/pd-protocol.md section 4)

/* Sends REJECT reason/msg for req_id to the router. */
static void pf__embed_reject(pf__worker *w, uint64_t req_id, const ks_errbuf *eb) {
    admit_reason reason =
        admit_reason_on_wire(eb->reason) ? (admit_reason)eb->reason : ADMIT_INTERNAL;
    pd_msg_reject j = {
        .reason = (uint32_t)reason, .msg = eb->msg, .msg_len = (uint32_t)strlen(eb->msg)};
    if (j.msg_len > PD_MSG_MAX_TEXT) j.msg_len = PD_MSG_MAX_TEXT;
    uint8_t buf[12 + PD_MSG_MAX_TEXT];
    uint32_t n = 0;
    ks_errbuf e2;
    if (pd_msg_reject_encode(&j, buf, sizeof buf, &n, &e2) != KS_OK) return;
    struct iovec iov = {.iov_base = buf, .iov_len = n};
    ks_log(KS_LOG_INFO, "embedding %" PRIu64 " rejected: %s", req_id,
           admit_reason_info(reason)->name);
    if (pf__router_send(w, PD_MSG_REJECT, req_id, &iov, 1, &e2) != KS_OK)
        ks_log(KS_LOG_DEBUG, "embedding %" PRIu64 ": REJECT to the router dropped: %s", req_id,
               e2.msg);
}

/* Computes an EMBED: admission as `kvseal serve` admits an embedding
 * (admit_embed against this worker's pool), the input in a sequence of its
 * own (tagged pages, I1; never the prefix cache), its hidden rows pooled in
 * position order (model_embd_*: the engine's arithmetic, so the vector is
 * bit-identical to serve's), the pages released and scrubbed (I3) before
 * EMBED_RESULT goes back. Any failure is a REJECT. Main loop only. */
static void pf__embed(pf__worker *w, uint64_t req_id, const uint8_t *payload, uint32_t len) {
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    pd_msg_embed m;
    int32_t *toks = NULL;
    kv_seq seq;
    bool has_seq = false;
    const int32_t E = model_hp(w->m)->n_embd;
    ks_err e = pd_msg_embed_decode(payload, len, &m, &eb);
    if (e) {
        char why[sizeof eb.msg];
        snprintf(why, sizeof why, "%s", eb.msg);
        e = admit_refuse(&eb, ADMIT_INVALID, "%s", why);
    }
    if (!e && w->draining) e = admit_refuse(&eb, ADMIT_DRAINING, NULL);
    if (!e && !(toks = malloc(sizeof(int32_t) * m.n_tokens)))
        e = admit_refuse(&eb, ADMIT_BUSY, "prefill worker: out of memory");
    if (!e) {
        for (uint32_t i = 0; i < m.n_tokens; i++)
            toks[i] = pd_msg_embed_token(&m, i);
        admit_limits lim = {.n_ctx = w->n_ctx,
                            .n_vocab = w->V,
                            .page_tokens = w->page_tokens,
                            .max_pages = kv_pool_n_pages(w->pool),
                            .prompt_only = true};
        const model_hparams *hp = model_hp(w->m);
        if (hp->encoder) { // read whole in one forward chunk, within position_embd
            if (lim.n_ctx > w->B) lim.n_ctx = w->B;
            if (lim.n_ctx > hp->n_ctx_train) lim.n_ctx = hp->n_ctx_train;
        }
        e = admit_embed(&lim, toks, m.n_tokens, &eb);
    }
    const model_pooling pool = !e && m.pooling ? (model_pooling)m.pooling : w->pooling;
    if (!e) {
        kv_seq_init(w->pool, &seq);
        has_seq = true;
        e = kv_seq_reserve(w->pool, &seq, m.n_tokens, &eb);
        if (e == KS_ERR_NOSPACE && w->prefix) { // cached pages nobody uses make room
            uint32_t need = (m.n_tokens + w->page_tokens - 1) / w->page_tokens;
            uint32_t more = need - seq.n_pages, nfree = kv_pool_n_free(w->pool);
            if (more > nfree) kv_prefix_evict(w->prefix, more - nfree);
            e = kv_seq_reserve(w->pool, &seq, m.n_tokens, &eb);
        }
        if (e) e = admit_refuse(&eb, ADMIT_BUSY, "the prefill worker's KV cache is full");
    }
    model_embd_acc acc;
    if (!e) model_embd_begin(&acc, pool, E, w->eacc);
    kv_seq *seqs[1] = {&seq};
    for (uint32_t off = 0; !e && off < m.n_tokens;) {
        int32_t chunk = m.n_tokens - off < (uint32_t)w->B ? (int32_t)(m.n_tokens - off) : w->B;
        int32_t n_hid = 0;
        for (int32_t j = 0; j < chunk; j++) {
            uint32_t p = off + (uint32_t)j;
            w->b_tok[j] = toks[p];
            w->b_pos[j] = (int32_t)p;
            w->b_seq[j] = 0;
            w->b_out[j] = -1;
            bool want = pool == MODEL_POOL_MEAN ||
                        (pool == MODEL_POOL_CLS ? p == 0 : p == m.n_tokens - 1);
            w->b_hid[j] = want ? n_hid++ : -1;
        }
        model_batch b = {.n_tokens = chunk,
                         .tokens = w->b_tok,
                         .pos = w->b_pos,
                         .seq = w->b_seq,
                         .out_row = w->b_out,
                         .n_out = 0,
                         .n_seqs = 1,
                         .seqs = seqs};
        model_hidden hid = {.row = w->b_hid, .n_rows = n_hid, .out = w->hidden};
        w->job_hid = &hid;
        e = pf__forward(w, &b, &eb);
        w->job_hid = NULL;
        if (e) {
            ks_log(KS_LOG_ERROR, "embedding %" PRIu64 ": %s", req_id, eb.msg);
            e = admit_refuse(&eb, ADMIT_INTERNAL, "internal error: the forward pass failed");
            break;
        }
        model_embd_add(&acc, w->hidden, n_hid);
        off += (uint32_t)chunk;
    }
    if (has_seq) kv_seq_release(w->pool, &seq); // scrubbed before it is free again (I3)
    if (!e && model_embd_finish(&acc, w->evec) != KS_OK)
        e = admit_refuse(&eb, ADMIT_INTERNAL, "internal error: nothing was pooled");
    free(toks);
    if (e) {
        pf__embed_reject(w, req_id, &eb);
        return;
    }
    pd_msg_embed_result r = {
        .n_embd = (uint32_t)E, .n_tokens = m.n_tokens, .pooling = (uint32_t)pool};
    uint32_t n = 0;
    uint8_t *buf = NULL;
    if (pd_msg_embed_result_encode(&r, w->evec, NULL, 0, &n, &eb) == KS_OK) buf = malloc(n);
    if (!buf || pd_msg_embed_result_encode(&r, w->evec, buf, n, &n, &eb) != KS_OK) {
        free(buf);
        admit_refuse(&eb, ADMIT_INTERNAL, "prefill worker: cannot encode EMBED_RESULT");
        pf__embed_reject(w, req_id, &eb);
        return;
    }
    struct iovec iov = {.iov_base = buf, .iov_len = n};
    if (pf__router_send(w, PD_MSG_EMBED_RESULT, req_id, &iov, 1, &eb) != KS_OK)
        ks_log(KS_LOG_DEBUG, "embedding %" PRIu64 ": EMBED_RESULT to the router dropped: %s",
               req_id, eb.msg);
    free(buf);
}

// ----------------------------------------------------------------------------
// Links

/* The link with pd_send id key (PF_KEY), or NULL. */
static pf__link *pf__find_link(pf__worker *w, uint32_t key) {
    for (int i = 0; i < w->n_links; i++)
        if (w->links[i]->key == key) return w->links[i];
    return NULL;
}

static void pf__remove_link(pf__worker *w, pf__link *k) {
    for (int i = 0; i < w->n_links; i++)
        if (w->links[i] == k) {
            w->links[i] = w->links[--w->n_links];
            break;
        }
    free(k);
}

/* Starts closing the link's conn; on_close follows from the loop. */
static void pf__link_close(pf__link *k) {
    k->closing = true;
    pd_conn_close(k->conn);
}

/* Sends ERROR best-effort and closes the link after flushing. */
static void pf__link_fail(pf__link *k, const char *msg) {
    k->closing = true;
    cl_error_close(k->conn, KS_ERR_PROTO, msg);
}

static void pf__link_on_open(pd_conn *c, void *ud) {
    pf__link *k = ud;
    if (!k) return;
    const cl_ctrl *rc = k->w->rts[k->rt].ctrl;
    k->link_id = cl_ctrl_worker_id(rc);
    k->router_id = cl_ctrl_router_id(rc);
    pd_msg_link m = {.prefill_worker_id = k->link_id, .router_id = k->router_id};
    memcpy(m.model_id, k->w->model_id, sizeof m.model_id);
    uint8_t buf[PD_MSG_LINK_LEN];
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = pd_msg_link_encode(&m, buf, sizeof buf, &len, &eb);
    if (e == KS_OK) {
        struct iovec iov = {buf, len};
        e = pd_conn_send(c, PD_MSG_LINK, 0, &iov, 1, &eb);
    }
    if (e != KS_OK) {
        ks_log(KS_LOG_WARN, "data link to decode worker %" PRIu32 ": LINK not sent: %s",
               k->decode_id, eb.msg);
        pf__link_close(k);
    }
}

static void pf__link_on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    pf__link *k = ud;
    if (!k || k->conn != c) return;
    pf__worker *w = k->w;
    ks_errbuf eb;
    switch (f->hdr.type) {
    case PD_MSG_LINK_ACK: {
        pd_msg_link_ack a;
        if (k->up) {
            pf__link_fail(k, "duplicate LINK_ACK");
            return;
        }
        if (pd_msg_link_ack_decode(f->payload, f->payload_len, &a, &eb) != KS_OK) {
            pf__link_fail(k, eb.msg);
            return;
        }
        if (a.link_epoch == 0) {
            pf__link_fail(k, "LINK_ACK with epoch 0");
            return;
        }
        if (w->ucx && a.ucx_addr_len && // the UCX plane: decode's address, the link's key
            cl_ucxp_link_up(w->ucx, c, k->key, a.link_epoch, a.ucx_addr, a.ucx_addr_len,
                            &eb) != KS_OK) {
            pf__link_fail(k, eb.msg);
            return;
        }
        (void)pf__op_submit(w, PF_OP_LINK_UP, k->rt, 0, k->key, a.link_epoch, NULL, 0);
        k->up = true;
        k->epoch = a.link_epoch;
        k->backoff_ms = PF_BACKOFF_MIN_MS;
        ks_log(KS_LOG_INFO, "data link to decode worker %" PRIu32 " (%s:%u) up, epoch %" PRIu64,
               k->decode_id, k->host, (unsigned)k->port, k->epoch);
        return;
    }
    case PD_MSG_ABORT: {
        pd_msg_abort a;
        if (!k->up) {
            pf__link_fail(k, "ABORT before LINK_ACK");
            return;
        }
        if (pd_msg_abort_decode(f->payload, f->payload_len, &a, &eb) != KS_OK) {
            pf__link_fail(k, eb.msg);
            return;
        }
        (void)pf__op_submit(w, PF_OP_ABORT, k->rt, f->hdr.req_id, k->key, k->epoch, NULL, 0);
        return;
    }
    case PD_MSG_ERROR: {
        pd_msg_error m;
        if (pd_msg_error_decode(f->payload, f->payload_len, &m, &eb) == KS_OK)
            ks_log(KS_LOG_WARN, "decode worker %" PRIu32 " sent ERROR %s: %.*s; closing the link",
                   k->decode_id, ks_err_name((ks_err)m.err), (int)m.msg_len, m.msg);
        pf__link_close(k);
        return;
    }
    default: // the type table forbids everything else
        pf__link_fail(k, "unexpected frame type on a data link");
        return;
    }
}

static void pf__link_on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    pf__link *k = ud;
    if (!k || k->conn != c) return;
    pf__worker *w = k->w;
    k->conn = NULL;
    uint64_t now = cl_now_ms(NULL);
    if (k->up) {
        ks_log(KS_LOG_INFO, "data link to decode worker %" PRIu32 " down, epoch %" PRIu64 " (%s: %s)",
               k->decode_id, k->epoch, ks_err_name(why), msg ? msg : "");
        (void)pf__op_submit(w, PF_OP_LINK_CLOSED, k->rt, 0, k->key, k->epoch, NULL, 0);
        if (w->ucx) cl_ucxp_link_closed(w->ucx, k->key, k->epoch);
        k->up = false;
        k->epoch = 0;
        k->backoff_ms = PF_BACKOFF_MIN_MS;
        k->next_attempt_ms = now + k->backoff_ms;
    } else {
        ks_log(KS_LOG_DEBUG, "data link to decode worker %" PRIu32 ": connect failed (%s: %s)",
               k->decode_id, ks_err_name(why), msg ? msg : "");
        k->next_attempt_ms = now + k->backoff_ms;
        k->backoff_ms = k->backoff_ms * 2 > PF_BACKOFF_MAX_MS ? PF_BACKOFF_MAX_MS : k->backoff_ms * 2;
    }
    if (!k->listed) pf__remove_link(w, k);
}

static void pf__link_on_writable(pd_conn *c, void *ud) {
    (void)c;
    (void)ud; // the loop re-checks pd_conn_out_pending before every pump
}

static void pf__link_connect(pf__link *k) {
    pf__worker *w = k->w;
    pd_conn_cbs cbs = {
        .on_open = pf__link_on_open,
        .on_frame = pf__link_on_frame,
        .on_writable = pf__link_on_writable,
        .on_close = pf__link_on_close,
        .type_max = w->link_tmax,
        .n_types = PD_MSG_N_TYPES,
        .peer_roles = 1u << PD_ROLE_DECODE,
    };
    ks_errbuf eb;
    pd_conn *c = NULL;
    if (pd_tcp_connect(w->loop, k->host, k->port, PF_CONNECT_TIMEOUT_MS, &cbs, k, &c, &eb) != KS_OK) {
        ks_log(KS_LOG_DEBUG, "data link to decode worker %" PRIu32 ": %s", k->decode_id, eb.msg);
        k->next_attempt_ms = cl_now_ms(NULL) + k->backoff_ms;
        k->backoff_ms = k->backoff_ms * 2 > PF_BACKOFF_MAX_MS ? PF_BACKOFF_MAX_MS : k->backoff_ms * 2;
        return;
    }
    k->conn = c;
    k->up = false;
    k->closing = false;
    k->link_id = 0;
}

/* PEER from router rt: open, move, or (port 0) close the link to a decode worker. */
static void pf__peer(pf__worker *w, int rt, const pd_frame *f) {
    pd_msg_peer p;
    ks_errbuf eb;
    if (pd_msg_peer_decode(f->payload, f->payload_len, &p, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "router: bad PEER: %s", eb.msg);
        return;
    }
    if (p.decode_worker_id >> PF_KEY_ID_BITS) {
        ks_log(KS_LOG_WARN, "router %s: PEER for decode worker %" PRIu32 " beyond this worker's "
               "ids (2^24 per router); ignored", cl_ctrl_name(w->rts[rt].ctrl), p.decode_worker_id);
        return;
    }
    pf__link *k = pf__find_link(w, PF_KEY(rt, p.decode_worker_id));
    if (p.port == 0) {
        if (!k) return;
        ks_log(KS_LOG_INFO, "decode worker %" PRIu32 " removed by the router; closing its link",
               p.decode_worker_id);
        k->listed = false;
        if (k->conn) pf__link_close(k); // on_close frees the link
        else pf__remove_link(w, k);
        return;
    }
    if (p.host_len == 0) {
        ks_log(KS_LOG_WARN, "router: PEER for decode worker %" PRIu32 " without a host",
               p.decode_worker_id);
        return;
    }
    char host[PD_MSG_MAX_HOST + 1];
    memcpy(host, p.host, p.host_len);
    host[p.host_len] = '\0';
    if (k && k->port == p.port && strcmp(k->host, host) == 0) {
        k->listed = true; // known: a closed link is being re-opened already
        k->named = true;
        return;
    }
    if (k) { // moved: the old link goes, a fresh record takes its place
        k->listed = false;
        if (k->conn) pf__link_close(k);
        else pf__remove_link(w, k);
    }
    if (w->n_links == w->cap_links) {
        int cap = w->cap_links ? 2 * w->cap_links : 8;
        pf__link **nl = realloc(w->links, (size_t)cap * sizeof *nl);
        if (!nl) {
            ks_log(KS_LOG_ERROR, "out of memory for decode worker %" PRIu32, p.decode_worker_id);
            return;
        }
        w->links = nl;
        w->cap_links = cap;
    }
    k = calloc(1, sizeof *k);
    if (!k) {
        ks_log(KS_LOG_ERROR, "out of memory for decode worker %" PRIu32, p.decode_worker_id);
        return;
    }
    k->w = w;
    k->rt = rt;
    k->decode_id = p.decode_worker_id;
    k->key = PF_KEY(rt, p.decode_worker_id);
    memcpy(k->host, host, sizeof host);
    k->port = p.port;
    k->listed = true;
    k->named = true;
    k->backoff_ms = PF_BACKOFF_MIN_MS;
    w->links[w->n_links++] = k;
    pf__link_connect(k);
}

// ----------------------------------------------------------------------------
// pd_send's emit, the router's frames, health

/* Logs a REJECT to the router: req_id and reason only (the
 * message may quote request details; never log content). */
static void pf__log_reject(uint64_t req_id, const struct iovec *iov, int n_iov) {
    uint8_t buf[12 + PD_MSG_MAX_TEXT];
    size_t len = 0;
    for (int i = 0; i < n_iov; i++) {
        if (len + iov[i].iov_len > sizeof buf) return;
        memcpy(buf + len, iov[i].iov_base, iov[i].iov_len);
        len += iov[i].iov_len;
    }
    pd_msg_reject r;
    if (pd_msg_reject_decode(buf, (uint32_t)len, &r, NULL) != KS_OK) return;
    ks_log(KS_LOG_INFO, "request %" PRIu64 " rejected: %s", req_id,
           admit_reason_info((admit_reason)r.reason)->name);
}

static void pf__emit(void *ctx, uint32_t key, uint64_t epoch, uint16_t type, uint64_t req_id,
                     const struct iovec *iov, int n_iov) {
    pf__worker *w = ctx;
    ks_errbuf eb;
    if (epoch == PD_SEND_ROUTER) {
        if (type == PD_MSG_REJECT) pf__log_reject(req_id, iov, n_iov);
        if (pf__router_send(w, type, req_id, iov, n_iov, &eb) != KS_OK)
            ks_log(KS_LOG_DEBUG, "request %" PRIu64 ": %s to the router dropped: %s", req_id,
                   pd_msg_type_name(type), eb.msg);
        return;
    }
    pf__link *k = pf__find_link(w, key);
    if (!k || !k->conn || k->closing || !k->up || k->epoch != epoch)
        return; // link gone: drop (F5 on decode)
    uint32_t decode_id = k->decode_id;
    if (w->ucx) { // the UCX plane: KV_PAGE goes as a sealed put; flushed before DONE/ABORT_ACK
        cl_ucx_verdict v = cl_ucxp_frame(w->ucx, key, epoch, type, req_id, iov, n_iov);
        if (v == CL_UCX_CONSUMED) return;
        if (v == CL_UCX_FAILED) {
            ks_log(KS_LOG_WARN, "data link to decode worker %" PRIu32 ": the UCX transfer of "
                   "request %" PRIu64 " failed; closing the link", decode_id, req_id);
            pf__link_close(k);
            return;
        }
    }
    // pd_send frees a request's pages right after its DONE or ABORT: the
    // KV_PAGE frames corked before it (pf__cork) leave first
    ks_err e = type == PD_MSG_KV_PAGE ? KS_OK : pd_conn_uncork(k->conn, &eb);
    if (e == KS_OK) e = pd_conn_send(k->conn, type, req_id, iov, n_iov, &eb);
    if (e == KS_OK) return;
    // a frame of a transfer cannot be skipped silently: tear the link down
    // (decode applies F5; pd_send drops the link's transfers on close)
    ks_log(KS_LOG_WARN, "data link to decode worker %" PRIu32 ": %s for request %" PRIu64
           " not sent (%s); closing the link", decode_id, pd_msg_type_name(type), req_id, eb.msg);
    pf__link_close(k);
}

static void pf__router_frame(void *ud, const pd_frame *f) {
    pf__rt *rt = ud;
    pf__worker *w = rt->w;
    ks_errbuf eb;
    switch (f->hdr.type) {
    case PD_MSG_PREFILL:
    {
        pf__op *op = pf__op_submit(w, PF_OP_PREFILL, rt->idx, f->hdr.req_id, 0, 0, f->payload,
                                   f->payload_len);
        // the grant's decode worker id is this router's: pd_send knows links by key
        if (op && op->len >= 4) {
            uint32_t d = pd_load_u32(op->payload);
            pd_store_u32(op->payload, d >> PF_KEY_ID_BITS ? PF_KEY_NONE : PF_KEY(rt->idx, d));
        }
        return;
    }
    case PD_MSG_EMBED:
        (void)pf__op_submit(w, PF_OP_EMBED, rt->idx, f->hdr.req_id, 0, 0, f->payload, f->payload_len);
        return;
    case PD_MSG_ABORT: {
        pd_msg_abort a;
        if (pd_msg_abort_decode(f->payload, f->payload_len, &a, &eb) != KS_OK) {
            ks_log(KS_LOG_WARN, "router: bad ABORT: %s", eb.msg);
            return;
        }
        (void)pf__op_submit(w, PF_OP_ABORT, rt->idx, f->hdr.req_id, 0, PD_SEND_ROUTER, NULL, 0);
        return;
    }
    case PD_MSG_PEER:
        pf__peer(w, rt->idx, f);
        return;
    default: // ERROR: ctrl.c logged it and closes
        return;
    }
}

static void pf__op_run(pf__worker *w, pf__op *op) {
    ks_errbuf eb;
    switch (op->kind) {
    case PF_OP_PREFILL: {
        pd_send_state st = PD_SEND_NONE;
        w->computing = true;
        w->cur_req = op->req_id; // pf__lp_chunk's PROMPT_LP frames carry it
        w->cur_rt = op->rt;      // and go to this router, as pd_send's REJECTs
        w->cur_lp = false;       // pf__admit sets it from the PREFILL's flags
        if (w->ucx) cl_ucxp_prefill(w->ucx, op->req_id, op->payload, op->len);
        ks_err e = pd_send_prefill(w->send, op->req_id, op->payload, op->len, &st, &eb);
        w->computing = false;
        if (w->ucx && st != PD_SEND_SENDING) cl_ucxp_forget(w->ucx, op->req_id);
        if (e != KS_OK)
            ks_log(KS_LOG_WARN, "request %" PRIu64 ": PREFILL not handled: %s", op->req_id, eb.msg);
        break;
    }
    case PF_OP_ABORT: pd_send_abort(w->send, op->req_id, op->decode_id, op->epoch); break;
    case PF_OP_EMBED:
        w->cur_rt = op->rt;
        w->computing = true;
        pf__embed(w, op->req_id, op->payload, op->len);
        w->computing = false;
        break;
    case PF_OP_LINK_UP:
        if (pd_send_link_up(w->send, op->decode_id, op->epoch, &eb) != KS_OK) {
            ks_log(KS_LOG_ERROR, "data link to decode worker %" PRIu32 ": %s", op->decode_id, eb.msg);
            pf__link *k = pf__find_link(w, op->decode_id);
            if (k && k->epoch == op->epoch) pf__link_close(k);
        }
        break;
    case PF_OP_LINK_CLOSED: {
        uint32_t dropped = pd_send_link_closed(w->send, op->decode_id, op->epoch);
        if (dropped)
            ks_log(KS_LOG_INFO, "data link to decode worker %" PRIu32 ": %" PRIu32 " transfers dropped",
                   op->decode_id, dropped);
        break;
    }
    }
}

static void pf__on_registered(void *ud, uint32_t worker_id) {
    pf__rt *rt = ud;
    pf__worker *w = rt->w;
    uint64_t router_id = cl_ctrl_router_id(rt->ctrl);
    // a link opened under an older registration with this router announced an
    // old worker id or router identity, which decode would never match against
    // ADMIT: re-open it under the new ones
    for (int i = 0; i < w->n_links; i++) {
        pf__link *k = w->links[i];
        if (k->rt != rt->idx) continue;
        if (k->conn && k->link_id != 0 && (k->link_id != worker_id || k->router_id != router_id))
            pf__link_close(k);
        k->named = false; // until this registration's PEER list names it again
    }
}

/* The router's PEER list for this registration is complete: a link it did
 * not name is to a decode worker id this router does not know (one a
 * restarted router's predecessor gave out), so it is retired rather than
 * retried forever; a decode worker the router learns of later comes in its
 * own PEER, under its new id. */
static void pf__on_synced(void *ud) {
    pf__rt *rt = ud;
    pf__worker *w = rt->w;
    for (int i = w->n_links - 1; i >= 0; i--) {
        pf__link *k = w->links[i];
        if (k->rt != rt->idx || k->named || !k->listed) continue;
        ks_log(KS_LOG_INFO, "decode worker %" PRIu32 " is not known to the router; retiring its link",
               k->decode_id);
        k->listed = false;
        if (k->conn) pf__link_close(k); // on_close frees the link
        else pf__remove_link(w, k);
    }
}

static void pf__on_lost(void *ud) {
    (void)ud; // F7: links keep serving ABORT/ABORT_ACK; no router, so no new PREFILL
}

static void pf__health(void *ud, pd_msg_health_ack *out) {
    pf__worker *w = ((pf__rt *)ud)->w;
    pd_send_stats ss;
    pd_send_get_stats(w->send, &ss);
    cl_health_fill(w->pool, ss.active, w->draining, out);
}

static void pf__pool_check(void *ud, pd_msg_pool_check_ack *out) {
    pf__worker *w = ((pf__rt *)ud)->w;
    pd_send_stats ss;
    pd_send_get_stats(w->send, &ss);
    // while a forward chunk runs, the compute thread owns the pool: busy (and
    // cl_pool_check_fill then never scans it). Otherwise, as `serve` does on
    // /admin/kv/check, the prefix cache lets go of its pages first.
    if (!w->computing && ss.active == 0 && w->prefix) kv_prefix_evict(w->prefix, UINT32_MAX);
    cl_pool_check_fill(w->pool, ss.active, w->computing, out);
}

// ----------------------------------------------------------------------------
// The loop

/* Corks (on) or uncorks every up link: a pump round's KV pages leave in
 * one sendmsg per link (pd_conn_cork) instead of one per page. */
static void pf__cork(pf__worker *w, bool on) {
    for (int i = 0; i < w->n_links; i++) {
        pf__link *k = w->links[i];
        if (!k->conn || !k->up || k->closing) continue;
        ks_errbuf eb;
        if (on) pd_conn_cork(k->conn);
        else if (pd_conn_uncork(k->conn, &eb) != KS_OK)  // closing: on_close follows
            ks_log(KS_LOG_DEBUG, "data link to decode worker %" PRIu32 ": %s", k->decode_id, eb.msg);
    }
}

/* True when every up link can take more KV_PAGE frames. */
static bool pf__can_pump(const pf__worker *w) {
    for (int i = 0; i < w->n_links; i++) {
        const pf__link *k = w->links[i];
        if (k->conn && k->up && pd_conn_out_pending(k->conn) > PF_PUMP_PENDING_MAX) return false;
    }
    return true;
}

/* Re-opens closed links once their backoff has passed: only those a PEER of
 * the latest registration named. A link closed at registration (opened under
 * a restarted router's predecessor) waits for its PEER: re-dialed under the
 * new router's identity with the predecessor's decode id, it would be a
 * second link from this worker to a decode worker the new router numbers
 * otherwise (decode refuses one of the two; the sync then retires the other
 * record's, perhaps the live one). */
static void pf__links_tick(pf__worker *w, uint64_t now) {
    for (int i = 0; i < w->n_links; i++) {
        pf__link *k = w->links[i];
        if (!k->conn && k->listed && k->named && now >= k->next_attempt_ms) pf__link_connect(k);
    }
}

static ks_err pf__tables(pf__worker *w, const kv_geom *g, ks_errbuf *eb) {
    ks_err e = pd_msg_type_max(g, w->router_tmax, eb);
    if (e != KS_OK) return e;
    memcpy(w->link_tmax, w->router_tmax, sizeof w->link_tmax);
    static const uint16_t from_router[] = {PD_MSG_REGISTER_ACK, PD_MSG_HEALTH, PD_MSG_PEER,
                                           PD_MSG_PREFILL,      PD_MSG_ABORT,  PD_MSG_POOL_CHECK,
                                           PD_MSG_ERROR,        PD_MSG_EMBED};
    static const uint16_t from_decode[] = {PD_MSG_LINK_ACK, PD_MSG_ABORT, PD_MSG_ERROR};
    for (uint32_t t = 0; t < PD_MSG_N_TYPES; t++) {
        bool r = false, d = false;
        for (size_t i = 0; i < sizeof from_router / sizeof *from_router; i++) r |= from_router[i] == t;
        for (size_t i = 0; i < sizeof from_decode / sizeof *from_decode; i++) d |= from_decode[i] == t;
        if (!r) w->router_tmax[t] = PD_TYPE_FORBIDDEN;
        if (!d) w->link_tmax[t] = PD_TYPE_FORBIDDEN;
    }
    return KS_OK;
}

static void pf__free(pf__worker *w) {
    cl_ucx_destroy(w->ucx); // flushes or force-closes the endpoints, then frees the records
    w->ucx = NULL;
    for (int i = 0; i < w->n_links; i++) {
        pf__link *k = w->links[i];
        if (k->conn) {
            pd_conn_set_ud(k->conn, NULL); // on_close runs in pd_loop_destroy: nothing to do
            pd_conn_close(k->conn);
        }
        free(k);
    }
    free(w->links);
    while (w->ops) {
        pf__op *op = w->ops;
        w->ops = op->next;
        free(op);
    }
    cl_health_destroy(w->health);
    for (int i = 0; i < w->n_rt; i++) cl_ctrl_destroy(w->rts[i].ctrl);
    pd_loop_destroy(w->loop);
    pd_send_destroy(w->send); // releases (scrubs) live transfers' local pages
    kv_prefix_destroy(w->prefix);
    model_ctx_free(w->mctx);
    kv_pool_destroy(w->pool);
    free(w->logits);
    grammar_vocab_destroy(w->gvocab);
    free(w->gmask);
    free(w->b_tok);
    free(w->b_pos);
    free(w->b_seq);
    free(w->b_out);
    free(w->b_hid);
    free(w->hidden);
    free(w->eacc);
    free(w->evec);
    free(w->lp_logits);
    free(w->lp_tok);
    free(w->lp_lp);
    free(w->lp_top);
    free(w->lp_buf);
    for (int i = 0; i < w->n_lora; i++) model_lora_free(w->lora[i]); // scrubs the factors
    free(w->lora);
    free(w->lora_digest);
}

ks_err cluster_prefill_run(const cluster_worker_opts *o, const atomic_int *stop,
                           ks_errbuf *eb) {
    cluster_router_addr ra[CLUSTER_MAX_ROUTERS];
    int n_rt = o ? cl_worker_routers(o, ra) : 0;
    if (!o || !o->m || !stop || !o->secret || o->secret_len < 16 || n_rt == 0)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "prefill worker: model, cluster secret (>= 16 bytes) and router address "
                         "are required");
    if (o->data_plane > PD_PLANE_UCX || (o->data_plane == PD_PLANE_UCX && o->insecure_plaintext))
        return ks_seterr(eb, KS_ERR_INVAL, "prefill worker: --data-plane ucx seals pages under "
                         "keys of the TLS data link: not with --insecure-plaintext");
    const engine_opts *eo = &o->eng;
    if (eo->n_ctx <= 0 || eo->kv_pages == 0 || eo->page_tokens <= 0 || eo->max_batch_tokens <= 0 ||
        eo->n_threads <= 0)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "prefill worker: n_ctx, kv_pages, page_tokens, max_batch_tokens and "
                         "n_threads must be positive");
    pf__worker w;
    memset(&w, 0, sizeof w);
    w.o = o;
    w.m = o->m;
    w.V = model_hp(o->m)->n_vocab;
    w.B = eo->max_batch_tokens;
    ks_err e;
    if ((e = model_kv_type_check(o->m, eo->kv_type, eb))) return e;
    kv_geom g = model_kv_geom(o->m, eo->page_tokens, eo->kv_type);
    if ((e = pf__tables(&w, &g, eb))) return e;
    w.logits = malloc((size_t)w.V * sizeof *w.logits);
    w.b_tok = malloc((size_t)w.B * sizeof *w.b_tok);
    w.b_pos = malloc((size_t)w.B * sizeof *w.b_pos);
    w.b_seq = malloc((size_t)w.B * sizeof *w.b_seq);
    w.b_out = malloc((size_t)w.B * sizeof *w.b_out);
    const size_t E = (size_t)model_hp(o->m)->n_embd;
    w.b_hid = malloc((size_t)w.B * sizeof *w.b_hid);
    w.hidden = malloc((size_t)w.B * E * sizeof *w.hidden);
    w.eacc = malloc(E * sizeof *w.eacc);
    w.evec = malloc(E * sizeof *w.evec);
    w.pooling = eo->pooling ? eo->pooling : model_pooling_default(o->m);
    if (!w.logits || !w.b_tok || !w.b_pos || !w.b_seq || !w.b_out || !w.b_hid || !w.hidden ||
        !w.eacc || !w.evec) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "prefill worker: out of memory");
        goto fail;
    }
    if ((e = kv_pool_create(&g, eo->kv_pages, eo->scrub, &w.pool, eb))) goto fail;
    if ((e = model_ctx_create(o->m, w.pool, eo->n_threads, w.B, eo->n_ctx, &w.mctx, eb))) goto fail;
    if ((e = pf__adapters(&w, eb))) goto fail;
    if (eo->prefix_cache &&
        (e = kv_prefix_create(w.pool, eo->prefix_max_pages ? eo->prefix_max_pages : eo->kv_pages / 4,
                              &w.prefix, eb)))
        goto fail;
    w.n_ctx = eo->n_ctx;
    w.page_tokens = (uint32_t)g.page_tokens;
    pd_send_cfg sc = {.emit = pf__emit,
                      .emit_ctx = &w,
                      .admit = pf__admit,
                      .admit_ctx = &w,
                      .reserve = pf__reserve,
                      .computed = pf__computed,
                      .reserve_ctx = &w,
                      .compute = pf__compute,
                      .compute_ctx = &w,
                      .clock = cl_now_ms};
    cluster_model_id(o->m, w.model_id);
    memcpy(sc.model_id, w.model_id, sizeof sc.model_id);
    if ((e = pd_send_create(w.pool, &sc, &w.send, eb))) goto fail;
    if (o->data_plane == PD_PLANE_UCX && (e = cl_ucx_create(&g, &w.ucx, eb))) goto fail;
    pd_loop_cfg lc = {.secret = o->secret, .secret_len = o->secret_len, .role = PD_ROLE_PREFILL,
                      .max_payload = PD_MSG_MAX_FRAME, .out_high_bytes = PF_OUT_HIGH,
                      .out_low_bytes = PF_PUMP_PENDING_MAX / 2,
                      .insecure_plaintext = o->insecure_plaintext};
    if ((e = pd_loop_create(&lc, &w.loop, eb))) goto fail;
    cl_ctrl_cfg cc = {.type_max = w.router_tmax, .t_router_ms = o->t_router_ms};
    cc.reg.role = PD_ROLE_PREFILL;
    cc.reg.kv_type = (uint8_t)g.kv_type;
    cc.reg.planes = (uint8_t)kv_geom_planes(&g);
    cc.reg.n_layer = (uint32_t)g.n_layer;
    cc.reg.kv_dim = (uint32_t)g.kv_dim;
    cc.reg.page_tokens = (uint32_t)g.page_tokens;
    cc.reg.n_pages = eo->kv_pages;
    cc.reg.n_ctx = (uint32_t)eo->n_ctx;
    cc.reg.data_port = 0;
    cc.reg.data_plane = o->data_plane;
    cc.reg.host = "";
    cc.reg.host_len = 0;
    cc.reg.names = o->names ? o->names : "";
    cc.reg.names_len = (uint16_t)strlen(cc.reg.names);
    cc.reg.adapters = w.lora_digest;
    cc.reg.n_adapters = (uint16_t)w.n_lora;
    memcpy(cc.reg.model_id, w.model_id, sizeof cc.reg.model_id);
    cl_ctrl_cbs cb = {.on_registered = pf__on_registered, .on_synced = pf__on_synced,
                      .on_frame = pf__router_frame, .on_lost = pf__on_lost, .health = pf__health,
                      .pool_check = pf__pool_check};
    for (int i = 0; i < n_rt; i++) {
        cc.router_host = ra[i].host;
        cc.router_port = ra[i].port;
        w.rts[i] = (pf__rt){.w = &w, .idx = i};
        if ((e = cl_ctrl_start(w.loop, &cc, &cb, &w.rts[i], &w.rts[i].ctrl, eb))) goto fail;
        w.n_rt = i + 1;
        ks_log(KS_LOG_INFO, "prefill worker: %u local KV pages, prefix cache %s, connecting to router %s:%d",
               eo->kv_pages, w.prefix ? "on" : "off", ra[i].host, ra[i].port);
    }
    if (o->health_host && (e = cl_health_start(o->health_host, o->health_port, 0, &w.health, eb)))
        goto fail;

    uint64_t last_tick = 0, drain_deadline = 0;
    for (;;) {
        if (atomic_load_explicit(stop, memory_order_acquire) && !w.draining) {  // graceful stop: finish what is held, take nothing new
            if (!o->drain_ms) break;
            w.draining = true;
            drain_deadline = cl_now_ms(NULL) + o->drain_ms;
            pd_send_set_draining(w.send, true);
            for (int i = 0; i < w.n_rt; i++) cl_ctrl_quiesce(w.rts[i].ctrl);
            ks_log(KS_LOG_INFO, "prefill worker: draining (up to %u ms)", o->drain_ms);
        }
        if (w.draining) {
            pd_send_stats ds;
            pd_send_get_stats(w.send, &ds);
            // done once idle AND released by the router (it closes the control
            // connection when nothing paired with us is left, so no PREFILL can
            // still be on its way)
            bool held = false;
            for (int i = 0; i < w.n_rt; i++) held |= cl_ctrl_registered(w.rts[i].ctrl);
            if (ds.active == 0 && !w.ops && !held) break;
            if (cl_now_ms(NULL) >= drain_deadline) {
                ks_log(KS_LOG_WARN, "prefill worker: drain timed out with %u transfers in flight",
                       ds.active);
                break;
            }
        }
        pd_send_stats ss;
        pd_send_get_stats(w.send, &ss);
        bool pump = ss.active > 0 && pf__can_pump(&w);
        if (pd_loop_run_once(w.loop, pump ? 0 : (ss.active > 0 ? 5 : PF_TICK_MS)) != KS_OK)
            ks_log(KS_LOG_WARN, "prefill worker: epoll_wait failed");
        if (w.ucx) cl_ucx_progress(w.ucx);
        pf__ops_drain(&w);  // PREFILLs compute here, serving the loop between chunks
        // send: a budget of pages per iteration, while no link is backed up
        // (corked: the round's pages go in one sendmsg per link)
        if (pf__can_pump(&w)) {
            pf__cork(&w, true);
            for (uint32_t i = 0; i < PF_PUMP_BUDGET; i++)
                if (pd_send_pump(w.send, 1) == 0) break;
            pf__cork(&w, false);
        }
        uint64_t now = cl_now_ms(NULL);
        if (now - last_tick >= PF_TICK_MS / 2) {
            last_tick = now;
            (void)pd_send_tick(w.send);
            pf__ctrl_tick(&w);
            pf__links_tick(&w, now);
            cl_health_beat(w.health, pf__any_registered(&w), w.draining);
        }
    }
    ks_log(KS_LOG_INFO, "prefill worker: stopping");
    pf__free(&w);
    return KS_OK;
fail:
    pf__free(&w);
    return e;
}
