/* router_int.h — the router's private layout, shared by its three files:
 * router.c (the loop thread: workers' frames, the request protocol, timers,
 * lifecycle), router_pair.c (the pairing policy: which prefill and decode
 * workers a request goes to) and router_backend.c (the HTTP-thread side: the
 * server_backend the HTTP front runs on). Each struct says which thread owns
 * what; the protocol is docs/pd-protocol.md section 5. */
#ifndef KS_ROUTER_INT_H
#define KS_ROUTER_INT_H

#include "cluster_int.h"

#include "kvseal/grammar.h"
#include "kvseal/tok.h"

#include <pthread.h>
#include <stdatomic.h>

#define RT_BUCKETS 256 /* request table: req_id % RT_BUCKETS chains */
#define RT_MAX_MODELS 64 /* catalog entries (rt__schedule's blocked mask) */

/* One model of the router's catalog (issue 40): what requests for it are
 * tokenized, admitted and detokenized with, and its own pools and counters.
 * Fixed at create but the atomics. */
typedef struct rt_model {
    const model *m;         /* borrowed */
    const tok_vocab *vocab;
    int32_t V;
    kv_geom g;
    int32_t n_ctx;          /* context advertised for it (admission, the pool check) */
    uint8_t model_id[32];
    char name[128];         /* for logs and errors: its first name */
    atomic_uint n_decode, n_prefill;
    atomic_uint max_decode_pages; /* largest registered decode pool, for admission */
    atomic_bool online;     /* per-model /admin offline: new requests get 503 */
    atomic_ullong n_admitted, n_rejected; /* requests past / refused at admission */
    atomic_ullong n_replaced;             /* started over after a lost prefill worker or link */
} rt_model;

typedef enum rt_phase {
    RT_WAITING = 0,    /* admitted here, no worker yet */
    RT_ADMITTING = 1,  /* ADMIT sent to decode */
    RT_PREFILLING = 2, /* GRANT received, PREFILL sent */
    RT_DECODING = 3,   /* first TOKEN received */
    RT_DONE = 4,       /* terminal (done event posted) */
} rt_phase;

typedef struct rt_worker {
    struct cluster_router *r;
    uint32_t id; /* 0 until registered */
    uint8_t role;
    int mi;      /* its catalog entry (r->models[mi]), set at REGISTER */
    pd_conn *c;
    char host[PD_MSG_MAX_HOST + 1];
    uint16_t data_port;
    uint32_t n_pages, n_ctx;
    uint32_t inflight;      /* requests paired with it, router's count */
    uint32_t free_pages, quarantined, active; /* last HEALTH_ACK */
    bool draining;          /* shutting down gracefully: paired with nothing new */
    uint8_t data_plane;     /* REGISTER's PD_PLANE_*: paired only with workers of the same */
    uint64_t health_seq, acked_seq;
    uint64_t last_ack_ms;
    bool check_pending;
    pd_msg_pool_check_ack check;
    uint8_t *adapters;      /* (n_adapters, 32) REGISTER's adapter digests, owned: checked
                               again when the tenants file's table is complete (seal) */
    uint32_t n_adapters;
    struct rt_worker *next;
} rt_worker;

typedef struct rt_req {
    atomic_int refs; /* the caller's handle + the loop's */
    cluster_router *r;
    uint64_t id;
    int mi; /* the request's catalog entry */
    char tenant[64];
    int32_t *prompt;
    int32_t n_prompt, max_tokens;
    sample_params sp;
    pd_msg_sampling ws; /* its extension points into g's text and bias */
    grammar *g;         /* constrained decoding (NULL: none); a reference */
    uint8_t *bias;      /* (ws.n_bias) raw logit_bias entries (pd_msg_bias_store) */
    uint8_t domain[32];
    uint8_t affinity[8];  /* hash of (domain, first prompt page); zero: no full page */
    uint64_t t_submit_ns, t_first_ns;
    uint64_t t_sched_ns; /* a decode worker GRANTed its pages: left the queue (0: not yet) */
    // loop-owned
    rt_phase phase;
    uint32_t p_id, d_id; /* paired workers (0: none) */
    bool p_sent;         /* PREFILL went to p_id */
    uint64_t t_phase_ms; /* entered WAITING / ADMITTING */
    uint64_t retry_ms;   /* WAITING: not before */
    int retries;         /* restarts (stale grant, draining or lost prefill) */
    int busy;            /* times a prefill worker answered BUSY (full KV cache) */
    uint32_t avoid_p;    /* prefill worker it lost (its link may be dying): not again */
    uint32_t avoid_d;    /* decode worker that had no link from its prefill worker
                          * (DENY NO_LINK): another one while another can hold it */
    int32_t n_gen;
    int32_t n_cached;    /* FINISH: prompt tokens prefill took from its prefix cache */
    struct rt_req *hnext; /* hash chain */
    struct rt_req *wnext; /* wait queue */
    engine_stream *out;   /* events, detokenizer, stop strings: as the engine's */
    atomic_int state; /* engine_state */
    atomic_bool cancelled;
    // embeddings (issue 13): prompt only, one prefill worker, no decode worker
    bool embed;
    uint32_t pooling; /* EMBED's pooling (0: the prefill worker's) */
    float *evec;      /* (n_embd) written by the loop before the done event */
    // echo with prompt logprobs (issue 12), loop-owned after submit
    bool echo_lp;     /* PREFILL asks for PROMPT_LP records */
    bool prompt_only; /* max_tokens 0: nothing generated is shown */
    uint32_t lp_top;  /* alternatives per record the prefill worker must send */
    uint32_t lp_next; /* the next prompt position a record must be for; 0: nothing posted
                         yet (then the request may still start over elsewhere) */
    bool lp_done;     /* the LAST PROMPT_LP was posted */
    struct rt_held *held, *held_tail; /* decode frames that overtook the LAST PROMPT_LP */
} rt_req;

/* A decode frame (TOKEN, FINISH) held until the prompt's records are out. */
typedef struct rt_held {
    struct rt_held *next;
    uint16_t type;
    uint32_t len;
    uint8_t payload[];
} rt_held;

/* One LoRA adapter of the router's table (the tenants file's "adapters"):
 * who may name it and the digest its requests carry. The factors live on
 * the workers (--lora); the router never loads them. */
typedef struct rt_adapter {
    char tenant[128];
    char name[ENGINE_ADAPTER_NAME_MAX];
    bool pub;
    float scale;
    int mi; /* its catalog entry */
    uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES];
} rt_adapter;

struct cluster_router {
    cluster_router_opts o;
    rt_model *models; /* (n_models) the catalog; models[0] is o.m */
    int n_models;
    bool fault_mispair; /* TEST ONLY (KS_TEST_FAULTS, env KS_ROUTER_FAULT=mispair): decode
                           workers are picked whatever their model, so decode's own refusal
                           of another model's ADMIT is what the e2e test sees */
    uint8_t secret[256];
    size_t secret_len;
    uint32_t type_max[PD_MSG_N_TYPES];
    pd_loop *loop;
    pd_listener *ls;
    int port;
    pthread_t thread;
    atomic_bool stop;
    // loop-owned
    rt_worker *workers;
    uint32_t next_worker_id;
    uint64_t router_id;   /* this process's identity in REGISTER_ACK and RETIRE (random, never 0):
                             worker ids are its numbering, and a worker may serve several routers */
    rt_req *tab[RT_BUCKETS];
    rt_req *wait_head, *wait_tail;
    uint64_t last_health_ms;
    char *piece;
    size_t piece_cap;
    // shared (atomics)
    atomic_ullong next_req_id;
    uint64_t first_req_id; /* the first id this router issued (rt__first_req_id) */
    atomic_bool online;
    atomic_uint n_waiting, n_inflight;
    atomic_uint n_decode, n_prefill; /* over the catalog */
    atomic_ullong n_finished, n_aborted, n_rejected, tokens_in, tokens_out;
    atomic_uint kv_free, kv_quarantined, kv_total;
    // pool check (mu)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int check_state; /* 0 idle, 1 requested, 2 answered */
    uint64_t check_req; /* bumped per request; the loop starts a check when it changes */
    bool check_clean, check_busy;
    char check_msg[512];
    uint64_t check_id;
    // LoRA adapters (amu): any thread (router_backend.c rt__adapter_*)
    pthread_mutex_t amu;
    rt_adapter *adapters;
    int n_adapters, cap_adapters;
    bool adapters_sealed; /* cluster_router_adapters_seal: adapter_add refuses */
};

// ----------------------------------------------------------------------------
// The loop thread's side (router.c), called from the other two files

/* Frees q at once (its held frames, stream, grammar reference, buffers);
 * for a request no thread shares yet, or at the last reference. */
void rt__req_free(rt_req *q);
/* Drops one reference to q; the last frees it (rt__req_free). Any thread. */
void rt__unref(rt_req *q);
/* Ends q ABORTED and tells its paired workers (reason) which were reached.
 * Loop thread. */
void rt__abort(cluster_router *r, rt_req *q, uint32_t reason, ks_err err, const char *msg);
/* pd_loop_post callback of a submit: q joins the wait queue (or ends at once
 * when cancelled or stopping) and scheduling runs. Loop thread. */
void rt__on_submit(void *arg);
/* pd_loop_post callback of a cancel: q ends ABORTED if it is still in
 * flight, then the cancel's reference is dropped. Loop thread. */
void rt__on_cancel(void *arg);

/* Whether the worker registering for catalog entry mi with the n digests
 * at have (32 bytes each, REGISTER's) lacks an adapter of the router's
 * table for mi; then why names the first missing digest. Any thread. */
bool rt__adapters_missing(cluster_router *r, int mi, const uint8_t *have, uint32_t n, char *why,
                          size_t cap);
/* pd_loop_post callback of cluster_router_adapters_seal (arg: the router):
 * registered workers lacking an adapter of the table are refused. Loop thread. */
void rt__on_adapters_sealed(void *arg);

// ----------------------------------------------------------------------------
// The pairing policy (router_pair.c); loop thread, pure over the worker list

/* The registered, non-draining worker of model mi and role with the fewest requests in
 * flight (then the most free pages), other than avoid; a decode worker
 * needs need_pages pages at least; plane >= 0: only a worker on that data plane
 * (PD_PLANE_*), -1: any. NULL when there is none. */
rt_worker *rt__pick(cluster_router *r, int mi, uint8_t role, uint32_t need_pages, uint32_t avoid,
                    int plane);
/* The prefill worker of q's model for q: the least loaded one, unless the one q's prefix
 * prefers (rendezvous hash of q->affinity) is within RT_AFFINITY_SLACK
 * requests of it. NULL when no prefill worker is registered. */
rt_worker *rt__pick_prefill(cluster_router *r, const rt_req *q);
/* q's affinity key into out: a hash of (domain, the prompt's first page),
 * never all zero, when the prompt holds more than one page (a full page the
 * prefill cache could hold); out untouched (zero: no preference) otherwise.
 * Pure; any thread. */
void rt__affinity(const uint8_t domain[32], const int32_t *prompt, int32_t n_prompt,
                  int32_t page_tokens, uint8_t out[8] /* OUT */);

#endif /* KS_ROUTER_INT_H */
