/* cluster_int.h — parts shared by the cluster roles (src/cluster/): the
 * worker's control connection to the router (ctrl.c), sampling-parameter
 * conversion to and from the wire (common.c), and the per-role type tables.
 * Protocol: docs/pd-protocol.md. */
#ifndef KS_CLUSTER_INT_H
#define KS_CLUSTER_INT_H

#include "kvseal/cluster.h"
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"
#include "kvseal/sample.h"

// ----------------------------------------------------------------------------
// Sampling parameters on the wire (ADMIT, PREFILL)

/* Fills the wire form of a request's sampling: max_tokens, flags
 * (ignore_eos, logprobs), seed and every row of SAMPLE_PARAM_MAP (setting
 * PD_FLAG_EXT when an extension row is not off); grammar_len bytes
 * of GBNF text (gbnf) and n_bias raw bias entries (pd_msg_bias_store), borrowed,
 * go in the extension too. Returns false when a count is out of the wire's
 * range, with the reason in msg. Pure. */
bool cl_sampling_to_msg(const sample_params *sp, int32_t max_tokens, bool ignore_eos,
                        const char *gbnf, uint32_t grammar_len, const uint8_t *bias,
                        uint32_t n_bias, pd_msg_sampling *out /* OUT */, char *msg, size_t cap);
/* The inverse for sample_params (every SAMPLE_PARAM_MAP row). Pure; can't fail
 * (validate the result with sample_params_validate). */
void cl_sampling_from_msg(const pd_msg_sampling *m, sample_params *sp /* OUT */,
                          bool *ignore_eos /* OUT */);
/* The bias entries of m into out (m->n_bias <= PD_MSG_MAX_BIAS entries);
 * returns their count. Pure. */
int cl_bias_from_msg(const pd_msg_sampling *m, sample_bias *out /* OUT: (m->n_bias) */);

// ----------------------------------------------------------------------------
// LoRA adapters (common.c)

/* Reads adapter l's file into *buf (malloc'd; the caller scrubs it with
 * sodium_memzero and frees it) and *len, and its digest (engine_adapter_digest
 * at l->scale). Errors: KS_ERR_IO naming the path, KS_ERR_NOMEM. Blocks. */
ks_err cl_lora_read(const cluster_lora *l, uint8_t **buf /* OUT */, size_t *len /* OUT */,
                    uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES] /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Lower-case hex of n bytes into out (2 n + 1 bytes, NUL-terminated). Can't fail. */
void cl_hex(const uint8_t *d, size_t n, char *out);

/* A worker's HEALTH_ACK load fields from its pool: active (transfers or
 * requests in flight), free and quarantined pages, the DRAINING flag. */
void cl_health_fill(const kv_pool *pool, uint32_t active, bool draining,
                    pd_msg_health_ack *out /* OUT */);
/* A worker's POOL_CHECK_ACK: page counts by state; clean only when nothing is
 * in flight (active == 0, !busy) and every page is FREE and scrubbed (I3).
 * The caller must own the pool (no forward pass running on it). */
void cl_pool_check_fill(const kv_pool *pool, uint32_t active, bool busy,
                        pd_msg_pool_check_ack *out /* OUT */);

/* The router's verdict on a worker's decoded REGISTER m for the catalog
 * entry of its model (model_id, g, the context n_ctx advertised for it, its
 * name model_name): true, with the
 * reason in why[0..cap), when it refuses the worker — a role other than the
 * one the peer authenticated as (peer_role), another model_id, another KV
 * geometry (n_layer, kv_dim, page_tokens), another plane count (2 = K, V;
 * 1 = one row per position: page layout, size and KV_PAGE lengths differ),
 * another KV type (pages are never converted), a decode worker without a
 * data-link host and port, or a decode worker whose pool cannot hold the
 * advertised context (n_ctx > 0): "pool 40 pages x 16 tokens = 640 <
 * context 1024 advertised for NAME". false (why untouched) when it accepts. Pure. */
bool cl_register_refused(const pd_msg_register *m, uint8_t peer_role,
                         const uint8_t model_id[PD_MSG_HASH_BYTES], const kv_geom *g,
                         int32_t n_ctx, const char *model_name, char *why, size_t cap);

/* A millisecond monotonic clock for pd_send/pd_recv cfg.clock; ctx unused. */
uint64_t cl_now_ms(void *ctx);
/* Ends a connection with a reason: ERROR{err, msg (cut to 512 bytes)} sent
 * best-effort, then closed once the output is flushed. Can't fail. */
void cl_error_close(pd_conn *c, ks_err err, const char *msg);

// ----------------------------------------------------------------------------
// A worker's control connection to the router (ctrl.c)
//
// Connects to the router, retrying with back-off (100 ms doubling to 2 s)
// until the handshake and REGISTER succeed; answers HEALTH (health cb) and
// POOL_CHECK (pool_check cb) itself; hands every other router frame to
// on_frame; after losing a registered connection (close, ERROR, or T_router
// without HEALTH) calls on_lost once and starts over. All on the loop thread.

typedef struct cl_ctrl cl_ctrl;

typedef struct cl_ctrl_cfg {
    const char *router_host;
    int router_port;
    pd_msg_register reg;       /* sent on every (re)connect; host and names borrowed */
    const uint32_t *type_max;  /* PD_MSG_N_TYPES entries (pd_msg_type_max with the role's
                                  forbidden types), borrowed, outlives the ctrl */
    uint32_t t_router_ms;      /* no HEALTH for this long: router lost (5000) */
} cl_ctrl_cfg;

typedef struct cl_ctrl_cbs {
    void (*on_registered)(void *ud, uint32_t worker_id);
    /* optional: the first HEALTH of a registration arrived, so every frame
     * the router sends with REGISTER_ACK (the PEER list) has too */
    void (*on_synced)(void *ud);
    /* any router frame but REGISTER_ACK, HEALTH and POOL_CHECK */
    void (*on_frame)(void *ud, const pd_frame *f);
    /* the registered connection is gone (F6/F7); a reconnect follows */
    void (*on_lost)(void *ud);
    /* fill active_requests, free_pages, quarantined_pages (seq is set here) */
    void (*health)(void *ud, pd_msg_health_ack *out /* OUT */);
    /* fill the POOL_CHECK answer (I3 check of the worker's pool) */
    void (*pool_check)(void *ud, pd_msg_pool_check_ack *out /* OUT */);
} cl_ctrl_cbs;

/* Starts connecting (cfg and cbs copied; cbs.on_frame, health, pool_check
 * required). Errors: KS_ERR_INVAL, KS_ERR_NOMEM. Loop thread. */
ks_err cl_ctrl_start(pd_loop *l, const cl_ctrl_cfg *cfg, const cl_ctrl_cbs *cbs, void *ud,
                     cl_ctrl **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Runs reconnect back-off and the T_router check; call at least every 50 ms
 * from the loop thread. Can't fail. */
void cl_ctrl_tick(cl_ctrl *c);
/* Sends a frame to the router. Errors: KS_ERR_PEER_CLOSED (not registered:
 * nothing sent), else as pd_conn_send. Loop thread. */
ks_err cl_ctrl_send(cl_ctrl *c, uint16_t type, uint64_t req_id, const struct iovec *iov,
                    int n_iov, ks_errbuf *eb) KS_MUST_USE;
/* Draining: once the current connection ends (the router releases a drained
 * worker by closing it), do not reconnect. Can't fail. */
void cl_ctrl_quiesce(cl_ctrl *c);
/* True while registered; can't fail. */
bool cl_ctrl_registered(const cl_ctrl *c);
/* The router-assigned worker id (0 before the first REGISTER_ACK). */
uint32_t cl_ctrl_worker_id(const cl_ctrl *c);
/* The router identity of the latest REGISTER_ACK (0 before the first): worker
 * ids are that router's numbering. Can't fail. */
uint64_t cl_ctrl_router_id(const cl_ctrl *c);
/* "HOST:PORT" of the router this connection serves, for logs. Can't fail. */
const char *cl_ctrl_name(const cl_ctrl *c);

/* The routers a worker registers with: o->routers, or the single
 * router_host/router_port. Fills out[0..n) (borrowed strings) and returns n,
 * or 0 when none is valid or there are more than CLUSTER_MAX_ROUTERS. Pure. */
int cl_worker_routers(const cluster_worker_opts *o,
                      cluster_router_addr out[CLUSTER_MAX_ROUTERS] /* OUT */);
/* Closes the connection (no on_lost) and frees; accepts NULL. Loop thread. */
void cl_ctrl_destroy(cl_ctrl *c);

// ----------------------------------------------------------------------------
// A worker's health endpoint (health_http.c): --health-port
//
// GET /health: 200 "ok" while the worker's loop turns (a beat within 30 s),
// else 503 with the reason. GET /ready: 200 "ready" only while the last
// beat said registered and not draining, else 503 and a one-line reason
// ("starting", "draining", "not registered with the router", a stalled
// loop). Answered on a thread of libmicrohttpd's; the loop only beats.

typedef struct cl_health cl_health;

/* Listens on host:port (0: any free port) and prints "health on
 * http://HOST:PORT" to stdout; a loop without a beat for stall_ms (0: 30 s)
 * is not live. *out owned by the caller (cl_health_destroy). Errors:
 * KS_ERR_INVAL (address), KS_ERR_IO (bind), KS_ERR_NOMEM. */
ks_err cl_health_start(const char *host, int port, uint32_t stall_ms, cl_health **out /* OUT */,
                       ks_errbuf *eb) KS_MUST_USE;
/* The bound port; can't fail. */
int cl_health_port(const cl_health *h);
/* The worker's loop ran now, registered (with the router) and draining as
 * given; h may be NULL (no endpoint). Lock-free; can't fail. Call from the
 * loop at least every few seconds. */
void cl_health_beat(cl_health *h, bool registered, bool draining);
/* Stops listening (joins its thread) and frees; accepts NULL. Blocks. */
void cl_health_destroy(cl_health *h);

#endif /* KS_CLUSTER_INT_H */
