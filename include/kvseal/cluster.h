/* cluster.h — the three long-running roles of a disaggregated deployment
 * (module `cluster`): `kvseal router` (the HTTP front: same API, tenants and
 * admission as `kvseal serve`, pairing, token relay), `kvseal prefill`
 * (re-validation, the prompt's forward pass, KV push) and `kvseal decode`
 * (page grants, verified commit, generation). They talk KVPD v1
 * (docs/pd-protocol.md) over authenticated TCP (include/kvseal/pd.h).
 *
 * Threading: each worker runs one pd_loop. The prefill worker runs it on the
 * calling thread and runs each forward chunk on a compute thread meanwhile
 * (health checks are answered during long prompts); the decode worker runs it on the
 * engine's scheduler thread (engine_opts.poll), so the KV pool, the transfer
 * receiver and every running sequence have one owner. The router runs its
 * loop on a thread of its own; HTTP threads reach it through the server
 * backend interface (server.h) and pd_loop_post. */
#ifndef KS_CLUSTER_H
#define KS_CLUSTER_H

#include <stdatomic.h>

#include "kvseal/base.h"
#include "kvseal/engine.h"
#include "kvseal/model.h"
#include "kvseal/server.h"

/* Reads the shared cluster secret from path: the file's bytes with trailing
 * whitespace removed, at least 16 and at most cap bytes. Refuses a file that
 * group or others may read (mode & 077), as ssh does for keys. Errors:
 * KS_ERR_IO (cannot read: names the path and errno), KS_ERR_INVAL (too short,
 * too long, or readable by others). */
ks_err cluster_secret_load(const char *path, uint8_t *buf, size_t cap, size_t *len /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;

/* SHA-256 of the model file's metadata + tensor-info block (bytes [0,
 * data_offset) of the GGUF) and the model's geometry: the REGISTER model_id.
 * Can't fail. */
void cluster_model_id(const model *m, uint8_t out[32] /* OUT */);

/* Most routers one worker registers with (cluster_worker_opts.routers). */
#define CLUSTER_MAX_ROUTERS 16

/* One router's control address. */
typedef struct cluster_router_addr {
    const char *host; /* borrowed */
    int port;
} cluster_router_addr;

/* One LoRA adapter a worker holds (`--lora PATH[:SCALE]`). */
typedef struct cluster_lora {
    const char *path; /* the adapter's GGUF file (llama.cpp's format); borrowed */
    float scale;      /* the user scale (0 means 1), part of its digest */
} cluster_lora;

/* Options of a prefill or decode worker. */
typedef struct cluster_worker_opts {
    const model *m;          /* borrowed; outlives the worker */
    const uint8_t *secret;   /* cluster secret, secret_len >= 16 bytes; borrowed */
    size_t secret_len;
    bool insecure_plaintext; /* no TLS on any cluster connection (trusted fabric only;
                                pd_loop_cfg.insecure_plaintext); every node must agree */
    const char *router_host; /* the router's control address ("127.0.0.1") */
    int router_port;
    /* several routers (n_routers 1..CLUSTER_MAX_ROUTERS, routers borrowed; then
     * router_host/port are ignored): one control connection each, requests of
     * all of them served over the one pool; losing one ends only its requests */
    const cluster_router_addr *routers;
    int n_routers;
    /* decode only: the data-link listener (prefill workers connect here) */
    const char *data_host;      /* bind address ("127.0.0.1") */
    int data_port;              /* 0: any free port */
    const char *advertise_host; /* address sent in REGISTER (default data_host) */
    /* both: KV geometry and limits. Decode: the engine's options (m, n_ctx,
     * kv_pages, page_tokens, kv_type, n_threads, max_batch_tokens,
     * max_running, scrub; prefix_cache is ignored: off). Prefill: n_ctx,
     * kv_pages (its local pool), page_tokens, kv_type, n_threads,
     * max_batch_tokens (forward chunk), scrub. kv_type is registered and must
     * be the router's (cluster_router_opts.kv_type). */
    engine_opts eng;
    uint32_t t_grant_ms, t_xfer_ms, t_ack_ms; /* decode timers (0: protocol defaults) */
    uint32_t t_router_ms; /* both: no HEALTH for this long means the router is lost (0: 5 s;
                             at least 5 x the health interval the router announces) */
    uint32_t drain_ms; /* on stop: finish what is held for up to this long, taking nothing
                          new (HEALTH_ACK DRAINING, DENY/REJECT DRAINING); 0: abort at once */
    const char *names; /* the names it serves the model as, comma-separated (REGISTER names:
                          the file's name, then aliases); NULL: none; borrowed */
    uint8_t data_plane; /* how KV pages travel (pd_msg.h PD_PLANE_*): 0 TLS (KV_PAGE frames
                           on the data link), 1 UCX (sealed one-sided puts; needs TLS links;
                           registered, the router pairs only workers of one plane) */
    const char *health_host; /* both: the HTTP health endpoint's address (GET /health:
                                liveness, GET /ready: registered and not draining);
                                NULL: none */
    int health_port;         /* its port (0: any free one); prints "health on http://H:P" */
    /* both: the LoRA adapters it holds (n_lora of them, borrowed), each loaded
     * against m at start (a file that does not fit refuses the start, named)
     * and known by its digest (engine_adapter_digest of the file's bytes and
     * the scale), which REGISTER lists and requests name (PD_FLAG_ADAPTER) */
    const cluster_lora *lora;
    int n_lora;
} cluster_worker_opts;

/* Runs a prefill worker until *stop becomes non-zero (then drains, see
 * drain_ms; another thread sets *stop, or a signal handler: a lock-free
 * atomic may be written there): connects to the router (retrying with back-off until registered, and again after losing it),
 * opens a data link to every decode worker the router names, serves PREFILL
 * (with PD_FLAG_PROMPT_LP, echo: the prompt's logprob records go to the
 * router in PROMPT_LP messages before DONE goes to decode) and ABORT, and EMBED (an embedding input
 * computed and pooled here, its pages scrubbed before EMBED_RESULT goes back; pooling eng.pooling).
 * Returns KS_OK after a clean stop. Errors (at start only): KS_ERR_INVAL (options), KS_ERR_NOMEM,
 * KS_ERR_IO. Blocks. */
ks_err cluster_prefill_run(const cluster_worker_opts *o, const atomic_int *stop,
                           ks_errbuf *eb) KS_MUST_USE;

/* Runs a decode worker until *stop becomes non-zero (then drains, see
 * drain_ms; *stop as for cluster_prefill_run): listens for data links,
 * registers with the router (as prefill does), grants pages for ADMIT,
 * receives KV straight into its pool, commits only verified handoffs (I6)
 * and generates, streaming TOKEN/FINISH to the router. Prints "data link on
 * HOST:PORT" to stdout once listening. Errors (at start only): KS_ERR_INVAL,
 * KS_ERR_NOSPACE (pool too small, I8), KS_ERR_NOMEM, KS_ERR_IO. Blocks. */
ks_err cluster_decode_run(const cluster_worker_opts *o, const atomic_int *stop,
                          ks_errbuf *eb) KS_MUST_USE;

/* A further model of the router's catalog (cluster_router_opts.more). */
typedef struct cluster_router_model {
    const model *m;   /* borrowed: tokenizer, vocabulary, model_id, geometry */
    const char *name; /* its name in logs and errors (the file's name); borrowed */
    int32_t n_ctx;    /* context advertised for it (0: the router's n_ctx) */
} cluster_router_model;

/* Options of the router. */
typedef struct cluster_router_opts {
    const model *m;        /* borrowed: tokenizer, vocabulary, model_id, geometry of the
                              catalog's first entry (engine_params.model 0) */
    const char *name;      /* its name in logs and errors (NULL: "model") */
    const cluster_router_model *more; /* (n_more) entries 1.. of the catalog; borrowed.
                              Requests name their entry (engine_params.model); workers
                              register for one by model_id, and are paired only with
                              requests and workers of their own model */
    int n_more;
    const uint8_t *secret; /* cluster secret, borrowed */
    size_t secret_len;
    bool insecure_plaintext; /* as cluster_worker_opts */
    const char *host;      /* control listener address ("127.0.0.1") */
    int port;              /* 0: any free port (cluster_router_port) */
    int32_t n_ctx;         /* per-request limit, as engine_opts.n_ctx */
    int page_tokens;       /* workers must register this geometry (16) */
    int kv_type;           /* ... and this KV type (kv.h; the engine's default, F16): pages
                              travel in their type, so a worker with another is refused */
    uint32_t health_interval_ms; /* HEALTH period (1000); 3 misses drop a worker */
    uint32_t queue_timeout_ms;   /* a request waiting for decode capacity this long is aborted (30000) */
    uint32_t queue_max;          /* requests waiting for capacity; past it: 503 (64) */
    uint32_t ttft_timeout_ms;    /* admitted without a first token this long: aborted (60000) */
    model_pooling pooling;       /* embeddings' pooling sent in EMBED (DEFAULT: each prefill
                                    worker's own --pooling, or its model's) */
} cluster_router_opts;

/* Fills defaults for everything but m, secret and n_ctx. Can't fail. */
void cluster_router_opts_default(cluster_router_opts *o);

typedef struct cluster_router cluster_router;

/* Starts the router's loop thread and control listener. Errors: KS_ERR_INVAL,
 * KS_ERR_IO (bind), KS_ERR_NOMEM. *out owned by the caller. */
ks_err cluster_router_create(const cluster_router_opts *o, cluster_router **out /* OUT */,
                             ks_errbuf *eb) KS_MUST_USE;
/* The bound control port; can't fail. */
int cluster_router_port(const cluster_router *r);
/* The server backend that runs requests on the cluster (server_create_backend).
 * Valid until cluster_router_destroy. Can't fail. */
void cluster_router_backend(cluster_router *r, server_backend *out /* OUT */);
/* Ends the router's adapter table's loading: the tenants file's adapters
 * (server_backend.adapter_add, called while the HTTP front starts) are in,
 * and from here on adapter_add refuses with KS_ERR_UNSUPPORTED (POST
 * /admin/adapters answers 501: an adapter is added to the workers' --lora
 * and the router's tenants file, then they restart). Thread-safe; can't fail. */
void cluster_router_adapters_seal(cluster_router *r);
/* Aborts every request, closes every connection, joins the loop thread and
 * frees everything; accepts NULL. Call after server_destroy. Blocks. */
void cluster_router_destroy(cluster_router *r);

#endif /* KS_CLUSTER_H */
