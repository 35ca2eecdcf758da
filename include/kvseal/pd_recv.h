/* pd_recv.h — the decode side of a KVPD v1 transfer (docs/pd-protocol.md
 * sections 6 "Decode, per granted request", 7, 8, 9), without any network:
 * the decode worker's loop calls in for every ADMIT, KV_PAGE, DONE, REJECT,
 * ABORT, ABORT_ACK, link close and timer tick, and pd_recv tells it, through
 * one event callback, which frames to send (ABORT to prefill, FINISH to the
 * router), when to start generation (COMMIT) and which links to tear down.
 *
 * Per request: (none) -> GRANTED -> RECEIVING -> COMMITTED -> FREED, or
 * -> ABORTING -> FREED, or GRANTED/RECEIVING -> FREED directly (F2, F3, F5).
 * Pages are freed only by the rules F1-F5 of section 7; everything else that
 * ends a transfer quarantines them (kv_seq_quarantine) until ABORT_ACK (F4)
 * or the link is closed and drained (F5). Nothing is freed because time
 * passed: an expired T_ack only asks the caller to tear the link down.
 *
 * KV_PAGE data is received zero-copy: pd_recv_kv_page_begin validates the
 * 40-byte page header and hands out destination iovecs into the page's
 * planes — K and V, or the single row of a 1-plane pool (resolved only
 * through kv_seq_span_write, I1); pd_recv_kv_page_end
 * reports whether the frame checksum verified.
 *
 * Threading: a pd_recv and its pool are owned by one thread (the decode
 * worker's loop); no function blocks. Terminal req_ids are remembered for
 * cfg.tombstone_ms so late or duplicate frames are dropped. */
#ifndef KS_PD_RECV_H
#define KS_PD_RECV_H

#include <sys/uio.h>

#include "kvseal/base.h"
#include "kvseal/kv.h"
#include "kvseal/pd_msg.h"

/* Request states (section 6). NONE: unknown req_id (or its tombstone expired). */
typedef enum pd_recv_state {
    PD_RECV_NONE = 0,
    PD_RECV_GRANTED = 1,   /* pages reserved and tagged, T_grant runs */
    PD_RECV_RECEIVING = 2, /* at least one KV_PAGE accepted, T_xfer runs */
    PD_RECV_COMMITTED = 3, /* DONE verified (I6): pages READY, generation runs */
    PD_RECV_ABORTING = 4,  /* pages in QUARANTINE until ABORT_ACK (F4) or link drained (F5) */
    PD_RECV_FREED = 5,     /* terminal: pages scrubbed and FREE (tombstone) */
} pd_recv_state;

/* What the caller must do, delivered through pd_recv_cfg.emit. */
typedef enum pd_recv_ev_kind {
    PD_RECV_EV_ABORT = 1,    /* send ABORT{abort_reason} for req_id on the link link_epoch */
    PD_RECV_EV_FINISH = 2,   /* send FINISH{finish, n_prompt, 0, err, msg} for req_id to the router */
    PD_RECV_EV_COMMIT = 3,   /* DONE verified: emit TOKEN(done->first_token), start generation
                              * on pd_recv_seq(req_id); call pd_recv_finish when it ends */
    PD_RECV_EV_TEARDOWN = 4, /* T_ack expired: close and drain link link_epoch, then call
                              * pd_recv_link_closed (req_id is the request that expired) */
} pd_recv_ev_kind;

/* One event; pointers are valid only during the callback. */
typedef struct pd_recv_ev {
    pd_recv_ev_kind kind;
    uint64_t req_id;
    uint64_t link_epoch;
    uint32_t abort_reason;   /* EV_ABORT: PD_ABORT_* */
    uint32_t finish;         /* EV_FINISH: PD_FINISH_ABORT or PD_FINISH_ERROR */
    ks_err err;              /* EV_FINISH: why */
    uint32_t reason;         /* EV_FINISH: prefill's REJECT reason (admit_reason), else 0 */
    const char *msg;         /* EV_FINISH: client-facing text, NUL-terminated, valid
                                during the emit call */
    uint32_t n_prompt;       /* EV_FINISH / EV_COMMIT */
    const pd_msg_done *done; /* EV_COMMIT: the verified DONE (first token, rng state, top-n) */
} pd_recv_ev;

/* Event sink; called on the owner thread from inside pd_recv calls. It must
 * not call back into the same pd_recv. */
typedef void (*pd_recv_emit_fn)(void *ctx, const pd_recv_ev *ev);
/* Monotonic milliseconds. */
typedef uint64_t (*pd_recv_clock_fn)(void *ctx);

/* Configuration; zero fields take the defaults of section 8. */
typedef struct pd_recv_cfg {
    uint32_t n_ctx;           /* ADMIT: n_prompt + max_tokens <= n_ctx (0: no limit) */
    uint32_t t_grant_ms;      /* default 30000 */
    uint32_t t_xfer_ms;       /* default 10000 */
    uint32_t t_ack_ms;        /* default 5000 */
    uint32_t tombstone_ms;    /* terminal req_ids kept this long; default 2 * t_grant_ms */
    pd_recv_emit_fn emit;     /* required */
    void *emit_ctx;
    pd_recv_clock_fn clock;   /* NULL: ks_now_ns() / 1e6 */
    void *clock_ctx;
    uint8_t model_id[32];     /* the model the pool's pages belong to: an ADMIT for
                                 another is DENY MODEL, and every GRANT carries it */
} pd_recv_cfg;

/* Counters, for tests and HEALTH_ACK. */
typedef struct pd_recv_stats {
    uint32_t active;           /* requests in GRANTED/RECEIVING/COMMITTED/ABORTING */
    uint64_t granted, denied;
    uint64_t committed, verify_failed; /* DONE verified / DONE not verified (F2) */
    uint64_t pages_accepted;   /* KV_PAGE frames handed a destination */
    uint64_t page_rejects;     /* KV_PAGE frames failing a check (request -> ABORTING) */
    uint64_t tag_violations;   /* of which: page_id/tag not the grant's or the pool's (I1) */
    uint64_t checksum_fails;
    uint64_t aborts;           /* requests that entered ABORTING */
    uint64_t freed_direct;     /* F1-F3 and F5 of a live grant: kv_seq_release */
    uint64_t freed_quarantine; /* F4/F5 of an ABORTING request: kv_pool_quarantine_free */
    uint64_t dropped;          /* late/duplicate/unexpected frames dropped */
    uint64_t timeouts;         /* T_grant/T_xfer expiries */
    uint64_t teardowns;        /* T_ack expiries (EV_TEARDOWN) */
} pd_recv_stats;

typedef struct pd_recv pd_recv;

/* Creates a receiver over pool (borrowed: it must outlive the receiver).
 * Errors: KS_ERR_INVAL (no emit), KS_ERR_NOMEM. The caller owns *out. */
ks_err pd_recv_create(kv_pool *pool, const pd_recv_cfg *cfg, pd_recv **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;
/* Frees the receiver; accepts NULL. Live requests' pages are released
 * (quarantined ones scrubbed): call only once every link is drained. */
void pd_recv_destroy(pd_recv *r);

/* ADMIT arguments (the decoded ADMIT plus the link the caller found). */
typedef struct pd_recv_admit_args {
    uint32_t n_prompt;          /* >= 1 */
    uint32_t max_tokens;        /* >= 1 */
    uint32_t prefill_worker_id; /* the only writer the grant accepts */
    uint64_t link_epoch;        /* the up data link from prefill_worker_id; 0: none */
    const uint8_t *model_id;    /* (32) the request's model (ADMIT's; NULL: all zero);
                                   another than cfg.model_id is DENY MODEL, nothing reserved */
} pd_recv_admit_args;

/* ADMIT: reserves pages for n_prompt + max_tokens tokens, tags them, and
 * builds the GRANT payload for the prompt pages (*grant points into r, valid
 * until the request is terminal or r is destroyed); state GRANTED, T_grant
 * starts. On DENY returns an error, sets *deny_reason (PD_DENY_*) and the DENY
 * text in eb: KS_ERR_INVAL for DUPLICATE (a known or tombstoned req_id; the
 * existing request is untouched), CONTEXT, NO_LINK, MODEL (another model's
 * request: the message names both model ids' first bytes); KS_ERR_NOSPACE for
 * NOSPACE (nothing reserved); KS_ERR_NOMEM (reason NOSPACE). */
ks_err pd_recv_admit(pd_recv *r, uint64_t req_id, const pd_recv_admit_args *a,
                     const uint8_t **grant /* OUT */, uint32_t *grant_len /* OUT */,
                     uint32_t *deny_reason /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* KV_PAGE header (already decoded against the link geometry by
 * pd_msg_kv_page_decode) arriving on link link_epoch. Returns true and sets
 * dst[0..*n_dst) (at most planes * layer_count entries, planes =
 * kv_geom_planes of the pool: K then V rows [0, n_rows) of each layer, or the
 * single row's, in wire order; adjacent ones merged; cap_dst >= planes *
 * layer_count) when the payload may be
 * received into the page; pd_recv_kv_page_end must follow. Returns false
 * (*n_dst = 0) when the payload must be read and discarded: an unknown req_id
 * (EV_ABORT is emitted back), a terminal or ABORTING one (dropped), or a
 * failed check of section 6 (the request goes ABORTING: pages quarantined,
 * EV_ABORT and EV_FINISH ERROR emitted). Can't fail otherwise. */
bool pd_recv_kv_page_begin(pd_recv *r, uint64_t req_id, uint64_t link_epoch,
                           const pd_msg_kv_page *hdr, struct iovec *dst /* OUT */, int cap_dst,
                           int *n_dst /* OUT */);
/* Ends the delivery begun by the last pd_recv_kv_page_begin that returned
 * true for req_id: checksum_ok marks its layers received (RECEIVING, T_xfer
 * restarts); !checksum_ok moves the request to ABORTING (the caller closes
 * the link, which is F5). Can't fail; unknown or not pending: ignored. */
void pd_recv_kv_page_end(pd_recv *r, uint64_t req_id, bool checksum_ok);

/* DONE on link link_epoch: COMMITTED (EV_COMMIT, kv_seq_set_filled(n_prompt))
 * only if every grant page is complete for every layer, the complete pages'
 * n_tokens sum to n_prompt and d->covered == n_prompt (I6). Otherwise F2:
 * pages scrubbed and freed, EV_FINISH ERROR, FREED. Dropped (returns
 * false) when req_id is not GRANTED/RECEIVING on that link. Returns true when
 * it committed. */
bool pd_recv_done(pd_recv *r, uint64_t req_id, uint64_t link_epoch, const pd_msg_done *d);
/* REJECT from prefill on link link_epoch (F3): a GRANTED/RECEIVING request
 * on that link is freed directly (EV_FINISH ERROR carrying reason and msg,
 * NUL-terminated, NULL for a default text); otherwise dropped. */
void pd_recv_reject(pd_recv *r, uint64_t req_id, uint64_t link_epoch, uint32_t reason,
                    const char *msg);
/* ABORT from prefill on link link_epoch (F3): as pd_recv_reject, with
 * EV_FINISH ABORT. */
void pd_recv_prefill_abort(pd_recv *r, uint64_t req_id, uint64_t link_epoch);
/* ABORT from the router, the client, or shutdown: GRANTED/RECEIVING ->
 * ABORTING (quarantine, EV_ABORT{reason} to prefill, EV_FINISH ABORT), returns
 * true. COMMITTED: nothing changes here (the caller stops generation and
 * calls pd_recv_finish), returns false. Unknown/terminal: ignored, false. */
bool pd_recv_abort(pd_recv *r, uint64_t req_id, uint32_t reason);
/* pd_recv_abort(reason) for every GRANTED/RECEIVING request: router lost
 * (F6, PD_ABORT_WORKER_LOST) or shutdown (PD_ABORT_SHUTDOWN). COMMITTED
 * requests are the caller's (stop generation, pd_recv_finish). Returns how
 * many requests went ABORTING. */
uint32_t pd_recv_abort_all(pd_recv *r, uint32_t reason);
/* ABORT_ACK on link link_epoch (F4): an ABORTING request of that link is
 * scrubbed and freed (kv_pool_quarantine_free), FREED. Otherwise dropped. */
void pd_recv_abort_ack(pd_recv *r, uint64_t req_id, uint64_t link_epoch);
/* The link link_epoch is closed AND drained (F5): every request bound to it
 * in GRANTED/RECEIVING (EV_FINISH ERROR) or ABORTING is freed. Returns how
 * many requests were freed. */
uint32_t pd_recv_link_closed(pd_recv *r, uint64_t link_epoch);
/* Generation of a COMMITTED request ended (F1): pages released (scrubbed),
 * FREED. The caller sends its own FINISH. Other states: ignored. */
void pd_recv_finish(pd_recv *r, uint64_t req_id);

/* Timers: GRANTED past T_grant or RECEIVING past T_xfer -> ABORTING
 * (quarantine, EV_ABORT TIMEOUT, EV_FINISH ABORT TIMEOUT); ABORTING past
 * T_ack -> EV_TEARDOWN for its link (once per request; nothing freed).
 * Forgets tombstones older than tombstone_ms. Returns the number of events
 * emitted. */
uint32_t pd_recv_tick(pd_recv *r);

/* State of req_id (NONE when unknown or forgotten). */
pd_recv_state pd_recv_state_of(const pd_recv *r, uint64_t req_id);
/* The block table of a COMMITTED request (owned by r; valid until
 * pd_recv_finish), else NULL. */
kv_seq *pd_recv_seq(pd_recv *r, uint64_t req_id);
/* Copies the counters; can't fail. */
void pd_recv_get_stats(const pd_recv *r, pd_recv_stats *out /* OUT */);
/* Name of a state ("GRANTED"); static storage, never NULL. */
const char *pd_recv_state_name(pd_recv_state s);

#endif /* KS_PD_RECV_H */
