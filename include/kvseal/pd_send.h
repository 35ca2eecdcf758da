/* pd_send.h — the prefill side of a KVPD v1 transfer (docs/pd-protocol.md
 * section 6 "Prefill, per request", 7, 9), without any network: the prefill
 * worker's loop calls in for every PREFILL, ABORT, link up/close and timer
 * tick, and for sending (pd_send_pump); pd_send hands every frame it wants
 * sent to one emit callback.
 *
 * Per request: IDLE -> VALIDATING -> SENDING -> DONE_SENT, or
 * VALIDATING -> REJECTED (REJECT to the router and, when the grant's link is
 * up, to decode; never a KV_PAGE or DONE: I4, no placeholder), or
 * SENDING -> ABORTED (ABORT from the router or decode; compute error: ABORT
 * to decode; link closed: silently). Every terminal req_id is remembered for
 * cfg.tombstone_ms so a late or duplicate PREFILL is never served.
 *
 * The prompt's forward pass is the caller's (cfg.compute): pd_send reserves
 * the local pages (prefill's own pool, same geometry as decode's), calls
 * compute, marks the rows filled, then sends KV_PAGE frames whose page data
 * points straight at the local pages (kv_seq_span_read, zero copy) and
 * finally DONE. Local pages are released (scrubbed) after DONE, REJECT or
 * ABORT, and on link close.
 *
 * Threading: a pd_send and its pool are owned by one thread; nothing blocks
 * except inside the caller's compute. */
#ifndef KS_PD_SEND_H
#define KS_PD_SEND_H

#include <sys/uio.h>

#include "kvseal/base.h"
#include "kvseal/kv.h"
#include "kvseal/pd_msg.h"

/* link_epoch value of emit/abort meaning "the router's control connection". */
#define PD_SEND_ROUTER 0u

/* Request states (section 6). NONE: unknown req_id (or its tombstone expired). */
typedef enum pd_send_state {
    PD_SEND_NONE = 0,
    PD_SEND_SENDING = 1,   /* KV computed, KV_PAGE frames pending (pd_send_pump) */
    PD_SEND_DONE_SENT = 2, /* terminal: every page and DONE emitted */
    PD_SEND_REJECTED = 3,  /* terminal: REJECT emitted, nothing else ever */
    PD_SEND_ABORTED = 4,   /* terminal: ABORT seen, compute error, or link closed */
} pd_send_state;

/* Frame sink. Sends frame `type` for req_id with payload = the concatenation
 * of iov[0..n_iov) to decode worker decode_worker_id on its link link_epoch,
 * or to the router when link_epoch == PD_SEND_ROUTER (decode_worker_id 0).
 * The iovecs (KV_PAGE data points into the local pool) are valid only during
 * the call: the sink copies or writes them before returning. It must not
 * call back into the same pd_send. */
typedef void (*pd_send_emit_fn)(void *ctx, uint32_t decode_worker_id, uint64_t link_epoch,
                                uint16_t type, uint64_t req_id, const struct iovec *iov,
                                int n_iov);

/* What compute reports about the first token (sampled from the last prompt
 * position's logits with the request's sampling parameters). */
typedef struct pd_send_first {
    int32_t first_token;
    float logprob;
    uint32_t n_top; /* <= PD_MSG_MAX_TOP; pd_send clamps it to the request's n_probs */
    pd_msg_top top[PD_MSG_MAX_TOP];
    uint64_t rng_state; /* sampler state after the first token */
} pd_send_first;

/* The prompt forward pass: writes K/V of tokens[seq->n_tokens..n) (0 unless
 * cfg.reserve attached cached pages) for every layer into seq (pages already
 * reserved in pool, through kv_seq_span_write) and samples
 * the first token into *out. Errors: any ks_err (the transfer is aborted:
 * ABORT{ERROR} to decode). */
typedef ks_err (*pd_send_compute_fn)(void *ctx, kv_pool *pool, kv_seq *seq, const int32_t *tokens,
                                     uint32_t n, const pd_msg_sampling *sp,
                                     pd_send_first *out /* OUT */, ks_errbuf *eb);
/* Monotonic milliseconds. */
typedef uint64_t (*pd_send_clock_fn)(void *ctx);

/* Admission of a PREFILL (I4), before any page is reserved or computed: the
 * request contract (kvseal/admit.h) on the prompt and the sampling. KS_OK, or
 * a refusal made with admit_refuse: the REJECT carries eb->reason and
 * eb->msg (reason 0 is sent as ADMIT_INVALID). */
typedef ks_err (*pd_send_admit_fn)(void *ctx, const int32_t *tokens, uint32_t n,
                                   const pd_msg_sampling *sp, ks_errbuf *eb);
/* Reserves the prompt's local pages in seq (empty on entry). The caller's
 * prefix-cache policy may first attach pages cached under domain (I7: never
 * another domain's), leaving seq->n_tokens at the tokens they cover: compute
 * starts there and DONE reports them as cached. A failure is REJECTed
 * (eb->reason, 0 sent as ADMIT_BUSY) and seq is released by pd_send. */
typedef ks_err (*pd_send_reserve_fn)(void *ctx, kv_pool *pool, const uint8_t domain[32],
                                     const int32_t *tokens, uint32_t n, kv_seq *seq, ks_errbuf *eb);
/* Compute succeeded and seq holds the whole prompt: the caller may offer its
 * pages to a cache under domain. Can't fail. */
typedef void (*pd_send_computed_fn)(void *ctx, kv_pool *pool, const uint8_t domain[32],
                                    const int32_t *tokens, uint32_t n, kv_seq *seq);

/* Configuration; zero fields take defaults. */
typedef struct pd_send_cfg {
    uint32_t tombstone_ms;   /* terminal req_ids kept this long; default 60000 (2 x T_grant) */
    pd_send_emit_fn emit;    /* required */
    void *emit_ctx;
    pd_send_admit_fn admit; /* required (cluster/prefill.c: admit_request) */
    void *admit_ctx;
    pd_send_reserve_fn reserve;   /* NULL: kv_seq_reserve, nothing cached */
    pd_send_computed_fn computed; /* NULL: nothing */
    void *reserve_ctx;            /* reserve's and computed's */
    pd_send_compute_fn compute; /* required */
    void *compute_ctx;
    pd_send_clock_fn clock;  /* NULL: ks_now_ns() / 1e6 */
    void *clock_ctx;
    uint8_t model_id[32];    /* the model this worker computes: a PREFILL whose grant is for
                                another is REJECTed (INTERNAL, "grant is for another model") */
} pd_send_cfg;

/* Counters, for tests and HEALTH_ACK. */
typedef struct pd_send_stats {
    uint32_t active;          /* requests in SENDING */
    uint64_t started;         /* PREFILLs that passed validation */
    uint64_t rejected;        /* PREFILLs answered with REJECT */
    uint64_t pages_sent, done_sent; /* KV_PAGE frames (a deep model's page takes several), DONEs */
    uint64_t aborts;          /* ABORT frames processed (any source, duplicates too) */
    uint64_t acks_sent;
    uint64_t compute_errors;
    uint64_t link_drops;      /* transfers dropped because their link closed */
    uint64_t cached_tokens;   /* prompt tokens cfg.reserve attached instead of computed */
} pd_send_stats;

typedef struct pd_send pd_send;

/* Creates a sender over pool (borrowed, must outlive it). Errors:
 * KS_ERR_INVAL (missing emit, admit or compute), KS_ERR_NOMEM. */
ks_err pd_send_create(kv_pool *pool, const pd_send_cfg *cfg, pd_send **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;
/* Frees the sender; accepts NULL. Live transfers' local pages are released
 * (nothing is emitted). */
void pd_send_destroy(pd_send *s);

/* The data link to decode_worker_id is up with epoch link_epoch (from
 * LINK_ACK, never 0). A previous link to that worker with another epoch is
 * treated as closed (pd_send_link_closed); the same epoch again is a no-op. Errors: KS_ERR_INVAL (epoch 0), KS_ERR_NOMEM. */
ks_err pd_send_link_up(pd_send *s, uint32_t decode_worker_id, uint64_t link_epoch,
                       ks_errbuf *eb) KS_MUST_USE;
/* The link (decode_worker_id, link_epoch) closed: its transfers are dropped
 * without any further frame (ABORTED), their local pages released. Returns
 * how many transfers were dropped. Unknown links: 0. */
uint32_t pd_send_link_closed(pd_send *s, uint32_t decode_worker_id, uint64_t link_epoch);

/* PREFILL payload[0..len) from the router. KS_OK when the frame was handled:
 * either the request passed validation (section 6), its KV was computed and
 * it is SENDING (frames follow from pd_send_pump), or it failed and exactly
 * one REJECT went to the router (plus one to decode when the grant's link is
 * up and the request was not a duplicate/tombstoned one) and nothing else
 * will ever be sent for it; or a compute error sent ABORT{ERROR} to decode.
 * *state_out (may be NULL) gets the resulting state. Errors: KS_ERR_PROTO
 * when the payload does not parse (nothing emitted: the caller closes the
 * router connection), KS_ERR_NOMEM (nothing emitted, nothing recorded). */
ks_err pd_send_prefill(pd_send *s, uint64_t req_id, const uint8_t *payload, uint32_t len,
                       pd_send_state *state_out /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* Emits up to budget_pages KV_PAGE frames of SENDING requests (oldest first),
 * each followed by DONE when it was the request's last page (DONE_SENT, local
 * pages released). Returns the number of KV_PAGE frames emitted. Can't fail:
 * a local read failure (never expected) aborts the transfer (ABORT{ERROR}). */
uint32_t pd_send_pump(pd_send *s, uint32_t budget_pages);

/* ABORT for req_id from link link_epoch of decode_worker_id, or from the
 * router (link_epoch PD_SEND_ROUTER), in any state, unknown req_id included:
 * no further KV_PAGE or DONE, local pages released, tombstone; then
 * ABORT_ACK on the link the ABORT came from (decode; always, duplicates too),
 * or for a router ABORT on the grant's link if a transfer was started and
 * that link is up. ABORT_ACK is then the last frame for req_id on the link. */
void pd_send_abort(pd_send *s, uint64_t req_id, uint32_t decode_worker_id, uint64_t link_epoch);

/* Draining (graceful shutdown): every later PREFILL is answered REJECT
 * DRAINING (503) before any compute, like any failed re-validation; transfers
 * already SENDING finish. Can't fail. */
void pd_send_set_draining(pd_send *s, bool draining);

/* Forgets terminal req_ids older than tombstone_ms; returns how many. */
uint32_t pd_send_tick(pd_send *s);

/* State of req_id (NONE when unknown or forgotten). */
pd_send_state pd_send_state_of(const pd_send *s, uint64_t req_id);
/* Copies the counters; can't fail. */
void pd_send_get_stats(const pd_send *s, pd_send_stats *out /* OUT */);
/* Name of a state ("SENDING"); static storage, never NULL. */
const char *pd_send_state_name(pd_send_state st);

#endif /* KS_PD_SEND_H */
