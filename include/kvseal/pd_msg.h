/* pd_msg.h — typed payloads of the KVPD v1 protocol messages
 * (docs/pd-protocol.md section 4): type numbers, per-type length bounds for
 * the transport (pd_conn_cbs.type_max), and one encoder + one decoder per
 * message.
 *
 * Decoders take (payload, len) and validate exactly as the doc says: fixed
 * sizes, every length field consistent with len, no trailing bytes, counts
 * and enum values within range; reserved fields are ignored. Every failure is
 * KS_ERR_PROTO with a message naming the message and the field. Variable
 * parts (grant entries, tokens, top-n arrays, strings) are returned as
 * pointers INTO the payload plus a count — nothing is allocated, and the
 * decoded struct is valid only as long as the payload is. Read elements with
 * the *_at accessors (explicit little-endian loads; no struct is ever cast
 * over received bytes, STYLE.md section 11).
 *
 * Encoders write into a caller buffer: pd_msg_X_encode(&m, ..., buf, cap,
 * &len, eb). buf == NULL only computes *len (no validation). Otherwise the
 * message is validated with the same rules the decoder applies (what we send
 * we would accept): KS_ERR_INVAL with the decoder's message on a bad value,
 * KS_ERR_NOSPACE when cap < the encoded length.
 *
 * Every struct below is caller-allocated with all fields public; pointer
 * fields of a decoded struct borrow the payload (caller-owned). Wire offsets
 * and sizes of every field: docs/pd-protocol.md section 4 (field order here
 * follows the wire order). All functions are pure: thread-safe, never block.
 *
 * HELLO and AUTH (types 1, 2) belong to the transport (pd.h section 4) and
 * have no codecs here. */
#ifndef KS_PD_MSG_H
#define KS_PD_MSG_H

#include "kvseal/admit.h" /* REJECT reasons (the enum only: pd does not link engine) */
#include "kvseal/base.h"
#include "kvseal/kv.h"
#include "kvseal/sample.h" /* SAMPLE_PARAM_MAP (the macro only: pd does not link engine) */

// ----------------------------------------------------------------------------
// Types, bounds, names

/* Message types (u16 on the wire), append-only; numbers as in the doc. */
typedef enum pd_msg_type {
    PD_MSG_HELLO = 0x0001,
    PD_MSG_AUTH = 0x0002,
    PD_MSG_REGISTER = 0x0003,
    PD_MSG_REGISTER_ACK = 0x0004,
    PD_MSG_HEALTH = 0x0005,
    PD_MSG_HEALTH_ACK = 0x0006,
    PD_MSG_PEER = 0x0007,
    PD_MSG_LINK = 0x0008,
    PD_MSG_LINK_ACK = 0x0009,
    PD_MSG_ADMIT = 0x0010,
    PD_MSG_GRANT = 0x0011,
    PD_MSG_DENY = 0x0012,
    PD_MSG_PREFILL = 0x0013,
    PD_MSG_KV_PAGE = 0x0014,
    PD_MSG_DONE = 0x0015,
    PD_MSG_REJECT = 0x0016,
    PD_MSG_ABORT = 0x0017,
    PD_MSG_ABORT_ACK = 0x0018,
    PD_MSG_TOKEN = 0x0019,
    PD_MSG_FINISH = 0x001A,
    PD_MSG_POOL_CHECK = 0x001B,
    PD_MSG_POOL_CHECK_ACK = 0x001C,
    PD_MSG_RETIRE = 0x001D, /* R -> D: a prefill worker left; payload as LINK */
    PD_MSG_ERROR = 0x001F,
    PD_MSG_EMBED = 0x0020,        /* R -> P: an embedding input (issue 13) */
    PD_MSG_EMBED_RESULT = 0x0021, /* P -> R: its pooled vector */
    PD_MSG_PROMPT_LP = 0x0022,    /* P -> R: prompt logprob records (echo, issue 12) */
} pd_msg_type;

/* Size of a type-indexed table (pd_msg_type_max); types >= this are unknown. */
#define PD_MSG_N_TYPES 0x23u

#define PD_MSG_MAX_FRAME 67108864u      /* KS_PD_MAX_FRAME: 64 MiB */
#define PD_MSG_GRANT_MAX (4u << 20)     /* GRANT payload bound */
#define PD_MSG_PREFILL_MAX (16u << 20)  /* PREFILL payload bound */
#define PD_MSG_MAX_HOST 255u            /* REGISTER/PEER host_len */
#define PD_MSG_MAX_TEXT 512u            /* DENY/REJECT/FINISH/ERROR msg_len */
#define PD_MSG_MAX_TOP 64u              /* ADMIT n_probs, DONE/TOKEN n_top */
#define PD_MSG_KV_PAGE_HDR 40u          /* KV_PAGE page header (sink_prefix) */
#define PD_MSG_GRANT_FIXED 64u          /* 32 + the model_id (v3) */
#define PD_MSG_GRANT_ENTRY 24u
#define PD_MSG_PREFILL_FIXED 80u
#define PD_MSG_ADMIT_FIXED 112u         /* 80 + the model_id (v3) */
#define PD_MSG_LINK_LEN 48u             /* 8 + the model_id + the router identity (v3) */
#define PD_MSG_REGISTER_FIXED 64u       /* v3: names_len at 60 */
#define PD_MSG_MAX_NAMES 1024u          /* REGISTER names_len */
#define PD_MSG_MAX_ADAPTERS 1024u       /* REGISTER n_adapters (ENGINE_ADAPTERS_MAX) */
#define PD_MSG_ADAPTER_BYTES 32u        /* a LoRA adapter's digest (engine_adapter_digest) */
#define PD_MSG_HASH_BYTES 32u           /* model_id, domain_hash */
#define PD_MSG_UCX_ADDR_MAX 8192u       /* LINK_ACK's UCX worker address (the UCX data plane) */
#define PD_MSG_UCX_KEY_MAX 4096u        /* GRANT's packed UCX remote key */
/* Data planes (REGISTER byte 3): how KV pages travel from prefill to decode. */
enum { PD_PLANE_TLS = 0, PD_PLANE_UCX = 1 };
/* sampling extension, fixed part: 4 bytes per SAMPLE_WIRE_EXT row, n_bias, grammar_len */
#define PD_MSG__SEXT_SLOT(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, ...)        \
    +(wire == SAMPLE_WIRE_EXT ? 4u : 0u)
#define PD_MSG_SEXT_FIXED ((0u SAMPLE_PARAM_MAP(PD_MSG__SEXT_SLOT)) + 8u)
#define PD_MSG_MAX_BIAS 1024u           /* extension n_bias (SAMPLE_MAX_BIAS) */
#define PD_MSG_MAX_GRAMMAR (256u << 10) /* extension grammar_len (GRAMMAR_MAX_TEXT) */
/* Bytes of the largest sampling extension. */
#define PD_MSG_SEXT_MAX (PD_MSG_SEXT_FIXED + 8u * PD_MSG_MAX_BIAS + PD_MSG_MAX_GRAMMAR)

/* Node roles (HELLO, REGISTER). */
enum { PD_ROLE_ROUTER = 1, PD_ROLE_PREFILL = 2, PD_ROLE_DECODE = 3 };
/* ADMIT/PREFILL flags. PD_FLAG_EXT: the sampling extension (penalties,
 * logit bias, grammar) follows the message's other fields.
 * PD_FLAG_PROMPT_LP (echo): the prefill worker computes a logits row for
 * every prompt position (no prefix-cache attach) and sends the prompt's
 * logprob records, with n_probs alternatives each, to the router in
 * PROMPT_LP messages before its DONE; decode ignores it. */
/* PD_FLAG_ADAPTER: the request runs with a LoRA adapter; its digest
 * (pd_msg_sampling.adapter) is the payload's last 32 bytes, after the
 * sampling extension when there is one. Encoders set it from a non-zero
 * digest; a decoded digest is all zero without it (and never with it). */
enum {
    PD_FLAG_IGNORE_EOS = 1u, PD_FLAG_LOGPROBS = 2u, PD_FLAG_EXT = 4u, PD_FLAG_PROMPT_LP = 8u,
    PD_FLAG_ADAPTER = 16u
};
/* DENY reasons. */
enum {
    PD_DENY_NOSPACE = 1,
    PD_DENY_NO_LINK = 2,
    PD_DENY_CONTEXT = 3,
    PD_DENY_DUPLICATE = 4,
    PD_DENY_DRAINING = 5,
    PD_DENY_INVALID = 6, /* the sampling extension does not compile or validate here */
    PD_DENY_MODEL = 7    /* the ADMIT is for another model than the one this worker serves */
};
/* REJECT reasons are the request contract's (kvseal/admit.h), those whose wire
 * column is true (admit_reason_on_wire). */
/* ABORT reasons. */
enum {
    PD_ABORT_CLIENT_GONE = 1, PD_ABORT_TIMEOUT = 2, PD_ABORT_WORKER_LOST = 3,
    PD_ABORT_SHUTDOWN = 4, PD_ABORT_ERROR = 5, PD_ABORT_STOP = 6
};
/* FINISH finish values (as engine_finish). */
enum { PD_FINISH_STOP = 1, PD_FINISH_LENGTH = 2, PD_FINISH_ABORT = 3, PD_FINISH_ERROR = 4 };

/* The message name ("GRANT"), "UNKNOWN" for other values; never NULL, static. */
const char *pd_msg_type_name(uint16_t type);

/* Fills out[0..PD_MSG_N_TYPES) with every type's payload bound (doc section
 * 4), for pd_conn_cbs.type_max / n_types = PD_MSG_N_TYPES. HELLO, AUTH and
 * unassigned numbers get PD_TYPE_FORBIDDEN (type_max applies after the
 * handshake). KV_PAGE's bound is pd_msg_kv_page_len(g, page_tokens, n_layer)
 * — g NULL: KV_PAGE forbidden. Direction/phase restrictions are the caller's
 * (it sets further entries to PD_TYPE_FORBIDDEN). Errors: KS_ERR_INVAL (a
 * geometry field <= 0, an unsupported KV type (kv_geom_check), or a full
 * page frame over PD_MSG_MAX_FRAME). */
ks_err pd_msg_type_max(const kv_geom *g, uint32_t out[PD_MSG_N_TYPES] /* OUT */,
                       ks_errbuf *eb) KS_MUST_USE;

/* One {id, logprob} of a DONE/TOKEN top-n list. */
typedef struct pd_msg_top {
    int32_t id;
    float logprob;
} pd_msg_top;

/* Loads element i of a decoded top-n array (raw = the struct's `top`); the
 * caller guarantees i < n_top. Can't fail. */
pd_msg_top pd_msg_top_at(const uint8_t *raw, uint32_t i);

// ----------------------------------------------------------------------------
// Connection-level messages (req_id 0)

/* REGISTER (64 + host_len + names_len + 32 n_adapters): P/D -> R. */
typedef struct pd_msg_register {
    uint8_t role; /* PD_ROLE_PREFILL or PD_ROLE_DECODE */
    uint8_t kv_type; /* KV element type (kv.h, a ks_dtype: 0 F32, 1 F16, 8 Q8_0) */
    uint8_t planes;  /* rows per position per layer of the worker's pages (kv_geom_planes):
                      * 2 (K, V) or 1 (one row, MLA). Wire byte 2; decoded as 1 or 2 (a 0 on
                      * the wire, from a sender before this field, decodes as 2); the
                      * encoder writes 0 as 2 and refuses other values */
    uint32_t n_layer, kv_dim, page_tokens;
    uint32_t n_pages; /* pool capacity */
    uint32_t n_ctx;
    uint16_t data_port; /* decode: data-link port; prefill: 0 */
    uint8_t data_plane; /* PD_PLANE_*: wire byte 3 (0 from a sender before it: TLS) */
    uint8_t model_id[PD_MSG_HASH_BYTES];
    const char *host; /* host_len bytes, not NUL-terminated */
    uint16_t host_len; /* <= 255 */
    const char *names; /* names_len bytes, not NUL-terminated: the names the worker serves
                          its model as (file name, then aliases), comma-separated; may be empty */
    uint16_t names_len; /* <= PD_MSG_MAX_NAMES; no NUL byte */
    const uint8_t *adapters; /* n_adapters x 32 bytes after the names: the digests of the LoRA
                                adapters the worker holds (engine_adapter_digest); wire bytes
                                62..63 are n_adapters (0 from a sender before them) */
    uint16_t n_adapters;     /* <= PD_MSG_MAX_ADAPTERS */
} pd_msg_register;

/* REGISTER_ACK (16). */
typedef struct pd_msg_register_ack {
    uint32_t worker_id;
    uint32_t health_interval_ms;
    uint64_t router_id; /* the router process's identity (random, never 0): worker ids are
                           this router's numbering (issue 40, more than one router) */
} pd_msg_register_ack;

/* HEALTH (8). */
typedef struct pd_msg_health {
    uint64_t seq;
} pd_msg_health;

/* HEALTH_ACK flags. */
enum { PD_HEALTH_DRAINING = 1u /* finishing its work, takes no new requests */ };

/* HEALTH_ACK (24). */
typedef struct pd_msg_health_ack {
    uint64_t seq;
    uint32_t active_requests, free_pages, quarantined_pages;
    uint32_t flags; /* PD_HEALTH_*; other bits must be 0 */
} pd_msg_health_ack;

/* POOL_CHECK_ACK (24): P/D -> R, answering POOL_CHECK (empty payload, req_id =
 * the router's check id). clean = 1 only when the worker has no transfer or
 * request in flight and every page of its pool is FREE and scrubbed (I3). */
typedef struct pd_msg_pool_check_ack {
    uint32_t clean; /* 0 or 1 */
    uint32_t active; /* transfers/requests in flight */
    uint32_t free_pages, allocated, ready, quarantined;
} pd_msg_pool_check_ack;

/* PEER (8 + host_len). port 0: the decode worker was removed. */
typedef struct pd_msg_peer {
    uint32_t decode_worker_id;
    uint16_t port;
    const char *host; /* host_len bytes, not NUL-terminated */
    uint16_t host_len;
} pd_msg_peer;

/* LINK (48); also the payload of RETIRE (the prefill worker the router retired). */
typedef struct pd_msg_link {
    uint32_t prefill_worker_id; /* in the numbering of router router_id */
    uint8_t model_id[PD_MSG_HASH_BYTES]; /* the model the sender serves (v3): a data link
                                            between workers of two models never comes up */
    uint64_t router_id;         /* REGISTER_ACK's router identity (never 0) */
} pd_msg_link;

/* LINK_ACK (8, or 12 + ucx_addr_len from a decode worker on the UCX data
 * plane). link_epoch is never 0. */
typedef struct pd_msg_link_ack {
    uint64_t link_epoch;
    uint32_t ucx_addr_len;   /* 0: none; else <= PD_MSG_UCX_ADDR_MAX */
    const uint8_t *ucx_addr; /* decode's UCX worker address */
} pd_msg_link_ack;

/* ERROR (8 + msg_len). */
typedef struct pd_msg_error {
    uint32_t err; /* a ks_err value, 1 .. KS_ERR__COUNT-1 */
    const char *msg;
    uint32_t msg_len; /* <= 512 */
} pd_msg_error;

/* Decoders: parse payload[0..len) into *out (pointers into payload).
 * Errors: KS_ERR_PROTO naming the message and field. Don't block. */
ks_err pd_msg_register_decode(const uint8_t *payload, uint32_t len, pd_msg_register *out,
                              ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_register_ack_decode(const uint8_t *payload, uint32_t len,
                                  pd_msg_register_ack *out, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_health_decode(const uint8_t *payload, uint32_t len, pd_msg_health *out,
                            ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_health_ack_decode(const uint8_t *payload, uint32_t len, pd_msg_health_ack *out,
                                ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_pool_check_ack_decode(const uint8_t *payload, uint32_t len,
                                    pd_msg_pool_check_ack *out, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_peer_decode(const uint8_t *payload, uint32_t len, pd_msg_peer *out,
                          ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_link_decode(const uint8_t *payload, uint32_t len, pd_msg_link *out,
                          ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_link_ack_decode(const uint8_t *payload, uint32_t len, pd_msg_link_ack *out,
                              ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_error_decode(const uint8_t *payload, uint32_t len, pd_msg_error *out,
                           ks_errbuf *eb) KS_MUST_USE;

/* Encoders: see the header comment (buf NULL: size only; KS_ERR_INVAL,
 * KS_ERR_NOSPACE). Don't block. */
ks_err pd_msg_register_encode(const pd_msg_register *m, uint8_t *buf, size_t cap,
                              uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_register_ack_encode(const pd_msg_register_ack *m, uint8_t *buf, size_t cap,
                                  uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_health_encode(const pd_msg_health *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_health_ack_encode(const pd_msg_health_ack *m, uint8_t *buf, size_t cap,
                                uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_pool_check_ack_encode(const pd_msg_pool_check_ack *m, uint8_t *buf, size_t cap,
                                    uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_peer_encode(const pd_msg_peer *m, uint8_t *buf, size_t cap,
                          uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_link_encode(const pd_msg_link *m, uint8_t *buf, size_t cap,
                          uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_link_ack_encode(const pd_msg_link_ack *m, uint8_t *buf, size_t cap,
                              uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_error_encode(const pd_msg_error *m, uint8_t *buf, size_t cap,
                           uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Request messages (control connections)

/* Sampling parameters shared by ADMIT and PREFILL: one member per row of
 * SAMPLE_PARAM_MAP (kvseal/sample.h). The SAMPLE_WIRE_BASE rows sit at
 * fixed offsets of the message (n_probs <= 64); the SAMPLE_WIRE_EXT rows
 * (floats finite) are on the wire only with PD_FLAG_EXT, else they read as
 * the table's off values (penalties off, ...), as do no bias and no
 * grammar. Decoded pointers point into the payload. */
typedef struct pd_msg_sampling {
    uint32_t max_tokens; /* >= 1 (ADMIT) */
    uint32_t flags;      /* PD_FLAG_*; other bits must be 0 */
    uint64_t seed;
    SAMPLE_PARAM_FIELDS
    /* extension (PD_FLAG_EXT), after the SAMPLE_WIRE_EXT rows */
    uint32_t n_bias;         /* <= PD_MSG_MAX_BIAS */
    const uint8_t *bias;     /* n_bias raw 8-byte entries {i32 token, f32 bias}
                                (pd_msg_bias_at / pd_msg_bias_store) */
    const char *grammar;     /* GBNF text, not NUL-terminated; NULL when none */
    uint32_t grammar_len;    /* <= PD_MSG_MAX_GRAMMAR; 0: unconstrained */
    /* the request's LoRA adapter (PD_FLAG_ADAPTER, the payload's last 32 bytes):
     * its digest, all zero for none */
    uint8_t adapter[PD_MSG_ADAPTER_BYTES];
} pd_msg_sampling;

/* Loads bias entry i (< s->n_bias) of a sampling extension. Can't fail. */
void pd_msg_bias_at(const pd_msg_sampling *s, uint32_t i, int32_t *token /* OUT */,
                    float *bias /* OUT */);
/* Stores entry i of a raw bias array (8 bytes per entry) for an encoder. */
void pd_msg_bias_store(uint8_t *raw, uint32_t i, int32_t token, float bias);
/* Payload bytes the sampling extension of s adds (0 without PD_FLAG_EXT). */
uint64_t pd_msg_sext_size(const pd_msg_sampling *s);

/* ADMIT (112, + the sampling extension with PD_FLAG_EXT, + 32 with
 * PD_FLAG_ADAPTER): R -> D. */
typedef struct pd_msg_admit {
    uint32_t n_prompt; /* >= 1 */
    uint32_t prefill_worker_id;
    uint8_t domain_hash[PD_MSG_HASH_BYTES];
    pd_msg_sampling s;
    uint8_t model_id[PD_MSG_HASH_BYTES]; /* the request's model (v3): decode DENYs another */
} pd_msg_admit;

/* One GRANT page entry (host order). */
typedef struct pd_msg_grant_entry {
    uint32_t page_id;
    uint32_t first_token; /* = i * page_tokens; PD_MSG_STATE_PAGE for a recurrent-state page */
    uint32_t n_tokens;    /* min(page_tokens, n_prompt - first_token); page_tokens for a
                             state page (it travels as a full page) */
    uint64_t gen;         /* tag part 2 */
} pd_msg_grant_entry;

/* first_token of a grant entry that names a page of the sequence's
 * recurrent state (hybrid models): such entries follow the KV entries. */
#define PD_MSG_STATE_PAGE UINT32_MAX

/* GRANT (64 + 24 n_pages, <= 4 MiB): D -> R. Decoded: entries points at the
 * n_pages raw 24-byte entries inside the payload (pd_msg_grant_entry_at). */
typedef struct pd_msg_grant {
    uint64_t seq_uid;    /* tag part 1 */
    uint64_t link_epoch; /* never 0 */
    uint32_t n_prompt;   /* >= 1 */
    uint32_t page_tokens;/* >= 1 */
    uint32_t n_pages;    /* = ceil(n_prompt / page_tokens) + n_state */
    uint32_t n_state;    /* decoded: the trailing recurrent-state entries (hybrid models; 0
                            otherwise) */
    uint8_t model_id[PD_MSG_HASH_BYTES]; /* the model whose KV the pages hold (v3); PREFILL
                                            carries it inside its grant */
    const uint8_t *entries;
    /* the UCX data plane: the grant's staging area and remote key (wire
     * offset 28 is ucx_key_len; the rest follows the entries) */
    uint32_t ucx_key_len;   /* 0: the TLS plane; else <= PD_MSG_UCX_KEY_MAX */
    uint64_t ucx_addr;      /* staging area address in decode's memory */
    uint64_t ucx_len;       /* its size in bytes (> 0 with a key) */
    const uint8_t *ucx_key; /* packed remote key */
} pd_msg_grant;

/* Loads entry i of a decoded grant; the caller guarantees i < n_pages. */
pd_msg_grant_entry pd_msg_grant_entry_at(const pd_msg_grant *g, uint32_t i);
/* Payload bytes of a GRANT with n_pages entries (may exceed the bound). */
uint64_t pd_msg_grant_size(uint32_t n_pages);
/* Size of a GRANT payload with a UCX trailer of a key_len-byte key (0: none). */
uint64_t pd_msg_grant_size_ucx(uint32_t n_pages, uint32_t key_len);

/* DENY (8 + msg_len): D -> R. */
typedef struct pd_msg_deny {
    uint32_t reason; /* PD_DENY_* */
    const char *msg;
    uint32_t msg_len; /* <= 512 */
} pd_msg_deny;

/* PREFILL (80 + grant_len + 4 n_prompt [+ the sampling extension with
 * PD_FLAG_EXT] [+ 32 with PD_FLAG_ADAPTER], <= 16 MiB): R -> P. The decoder
 * checks the layout (grant_len consistent with the embedded grant's n_pages
 * and with len). It does NOT check the embedded grant's content: an
 * inconsistent grant is a re-validation failure (REJECT INVALID, doc
 * section 6), not a frame PROTO error — use pd_msg_prefill_grant. */
typedef struct pd_msg_prefill {
    uint32_t decode_worker_id;
    uint32_t n_prompt;
    uint8_t domain_hash[PD_MSG_HASH_BYTES];
    pd_msg_sampling s;
    const uint8_t *grant; /* the GRANT payload exactly as decode sent it */
    uint32_t grant_len;
    const uint8_t *tokens; /* n_prompt raw i32 (pd_msg_prefill_token) */
} pd_msg_prefill;

/* Loads prompt token i of a decoded PREFILL; i < n_prompt. Can't fail. */
int32_t pd_msg_prefill_token(const pd_msg_prefill *p, uint32_t i);
/* Fully decodes the embedded grant of a decoded PREFILL (all GRANT rules)
 * and checks its n_prompt equals the PREFILL's. Errors: KS_ERR_PROTO with a
 * "PREFILL: grant: ..." message (map it to REJECT INVALID). */
ks_err pd_msg_prefill_grant(const pd_msg_prefill *p, pd_msg_grant *out /* OUT */,
                            ks_errbuf *eb) KS_MUST_USE;
/* Payload bytes of a PREFILL (may exceed the bound). */
uint64_t pd_msg_prefill_size(uint32_t grant_len, uint32_t n_prompt);

/* REJECT (12 + msg_len): P -> R and P -> D. */
typedef struct pd_msg_reject {
    uint32_t reason; /* admit_reason with admit_reason_on_wire: the client's status and
                        error code come from the admit table, never from the wire */
    const char *msg;
    uint32_t msg_len;     /* <= 512 */
} pd_msg_reject;

/* ABORT (4). */
typedef struct pd_msg_abort {
    uint32_t reason; /* PD_ABORT_* */
} pd_msg_abort;

/* TOKEN (12 + 8 n_top): D -> R. Decoded: top points at n_top raw pairs. */
typedef struct pd_msg_token {
    int32_t token;
    float logprob;
    uint32_t n_top; /* <= 64 */
    const uint8_t *top;
} pd_msg_token;

/* FINISH (24 + msg_len): D -> R. */
typedef struct pd_msg_finish {
    uint32_t finish; /* PD_FINISH_* */
    uint32_t n_prompt, n_gen;
    uint32_t err;    /* ks_err; 0 unless finish is ABORT or ERROR */
    const char *msg;
    uint32_t msg_len; /* <= 512 */
    uint32_t n_cached; /* <= n_prompt: prompt tokens prefill took from its prefix cache */
    uint32_t reason;   /* admit_reason (admit_reason_on_wire) when the request was refused
                          (prefill's REJECT, decode's adoption), else 0 */
} pd_msg_finish;

ks_err pd_msg_admit_decode(const uint8_t *payload, uint32_t len, pd_msg_admit *out,
                           ks_errbuf *eb) KS_MUST_USE;
/* GRANT: also checks n_pages = ceil(n_prompt/page_tokens) and that entry i
 * covers exactly [i*page_tokens, min((i+1)*page_tokens, n_prompt)). */
ks_err pd_msg_grant_decode(const uint8_t *payload, uint32_t len, pd_msg_grant *out,
                           ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_deny_decode(const uint8_t *payload, uint32_t len, pd_msg_deny *out,
                          ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_prefill_decode(const uint8_t *payload, uint32_t len, pd_msg_prefill *out,
                             ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_reject_decode(const uint8_t *payload, uint32_t len, pd_msg_reject *out,
                            ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_abort_decode(const uint8_t *payload, uint32_t len, pd_msg_abort *out,
                           ks_errbuf *eb) KS_MUST_USE;
/* ABORT_ACK has no payload: len must be 0. */
ks_err pd_msg_abort_ack_decode(const uint8_t *payload, uint32_t len, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_token_decode(const uint8_t *payload, uint32_t len, pd_msg_token *out,
                           ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_finish_decode(const uint8_t *payload, uint32_t len, pd_msg_finish *out,
                            ks_errbuf *eb) KS_MUST_USE;

ks_err pd_msg_admit_encode(const pd_msg_admit *m, uint8_t *buf, size_t cap,
                           uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* entries: m->n_pages of them (m->entries is ignored). */
ks_err pd_msg_grant_encode(const pd_msg_grant *m, const pd_msg_grant_entry *entries,
                           uint8_t *buf, size_t cap, uint32_t *out_len /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_deny_encode(const pd_msg_deny *m, uint8_t *buf, size_t cap,
                          uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* m->grant/grant_len are copied verbatim; tokens: m->n_prompt of them
 * (m->tokens is ignored). The grant bytes get the same layout check as the
 * decoder's, not the content check. */
ks_err pd_msg_prefill_encode(const pd_msg_prefill *m, const int32_t *tokens, uint8_t *buf,
                             size_t cap, uint32_t *out_len /* OUT */,
                             ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_reject_encode(const pd_msg_reject *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_abort_encode(const pd_msg_abort *m, uint8_t *buf, size_t cap,
                           uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* top: m->n_top of them (m->top is ignored). */
ks_err pd_msg_token_encode(const pd_msg_token *m, const pd_msg_top *top, uint8_t *buf,
                           size_t cap, uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_finish_encode(const pd_msg_finish *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Data-link messages (KV_PAGE, DONE; REJECT/ABORT/ABORT_ACK as above)

/* KV_PAGE page header (the first 40 payload bytes; the page data follows and
 * goes straight into the pool page through the transport's sink). */
typedef struct pd_msg_kv_page {
    uint32_t page_index; /* into the grant */
    uint32_t page_id;
    uint64_t tag_seq_uid, tag_gen;
    uint32_t n_rows;     /* 1 .. page_tokens (must equal the grant entry's n_tokens) */
    uint32_t layer_first;
    uint32_t layer_count; /* >= 1, layer_first + layer_count <= n_layer */
} pd_msg_kv_page;

/* Exact KV_PAGE payload length for a geometry: 40 + layer_count *
 * kv_geom_planes(g) * n_rows * kv_row_bytes(g) — pages travel in the link's
 * KV type and plane count (64-bit, no overflow for u32 inputs). Can't fail. */
uint64_t pd_msg_kv_page_len(const kv_geom *g, uint32_t n_rows, uint32_t layer_count);
/* Decodes the page header from prefix[0..prefix_len) (>= 40 bytes; only the
 * first 40 are read) of a KV_PAGE frame whose payload is frame_len bytes, and
 * checks the header against the link's geometry and frame_len ==
 * pd_msg_kv_page_len (a length that fits the other plane count is named as
 * such). Grant/pool checks are the caller's. Errors: KS_ERR_PROTO (for the
 * sink to return). */
ks_err pd_msg_kv_page_decode(const uint8_t *prefix, uint32_t prefix_len, uint32_t frame_len,
                             const kv_geom *g, pd_msg_kv_page *out, ks_errbuf *eb) KS_MUST_USE;
/* Writes the 40-byte header (validated against g) into buf; *out_len = 40.
 * The page data (pd_msg_kv_page_len - 40 bytes) is sent as further iovecs. */
ks_err pd_msg_kv_page_encode(const pd_msg_kv_page *m, const kv_geom *g, uint8_t *buf,
                             size_t cap, uint32_t *out_len /* OUT */,
                             ks_errbuf *eb) KS_MUST_USE;

/* DONE flags (wire offset 28). PD_DONE_ADAPTER: the KV was computed under
 * a LoRA adapter, whose digest is the payload's last 32 bytes (after the
 * top entries); decode fails a request whose ADMIT named another (or none). */
enum { PD_DONE_ADAPTER = 1u };

/* DONE (32 + 8 n_top, + 32 with PD_DONE_ADAPTER): P -> D. Decoded: top
 * points at n_top raw pairs. n_top <= n_probs of the request is the
 * caller's check. */
typedef struct pd_msg_done {
    uint32_t covered;
    int32_t first_token;
    float logprob;
    uint32_t n_top; /* <= 64 */
    uint64_t rng_state;
    uint32_t cached; /* <= covered: of those, tokens prefill took from its prefix cache */
    const uint8_t *top;
    uint8_t adapter[PD_MSG_ADAPTER_BYTES]; /* the adapter the KV was computed under (all
                                              zero: none; encoded as PD_DONE_ADAPTER) */
} pd_msg_done;

ks_err pd_msg_done_decode(const uint8_t *payload, uint32_t len, pd_msg_done *out,
                          ks_errbuf *eb) KS_MUST_USE;
/* top: m->n_top of them (m->top is ignored). */
ks_err pd_msg_done_encode(const pd_msg_done *m, const pd_msg_top *top, uint8_t *buf,
                          size_t cap, uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Embeddings (issue 13): EMBED R -> P, EMBED_RESULT P -> R (control), or
// REJECT P -> R. No KV leaves the prefill worker: it computes the input in
// a sequence of its own pool, pools the hidden rows and releases (scrubs)
// the pages before it answers.

#define PD_MSG_EMBED_FIXED 40u
#define PD_MSG_EMBED_MAX PD_MSG_PREFILL_MAX /* EMBED payload bound */
#define PD_MSG_EMBED_RESULT_FIXED 16u
#define PD_MSG_EMBED_MAX_DIM 65536u /* EMBED_RESULT n_embd */

/* EMBED (40 + 4 n_tokens). Decoded: tokens points at n_tokens raw i32
 * (pd_msg_embed_token). */
typedef struct pd_msg_embed {
    uint32_t pooling;  /* 0: the worker's --pooling; 1 mean, 3 last (model_pooling) */
    uint32_t n_tokens; /* >= 1 */
    uint8_t domain_hash[PD_MSG_HASH_BYTES]; /* the tenant root (kv_prefix_root), for logs and
                                              policy; never a cache key: embeddings share no KV */
    const uint8_t *tokens;
} pd_msg_embed;

/* EMBED_RESULT (16 + 4 n_embd). Decoded: vec points at n_embd raw f32
 * (pd_msg_embed_value). */
typedef struct pd_msg_embed_result {
    uint32_t n_embd;   /* 1 .. PD_MSG_EMBED_MAX_DIM */
    uint32_t n_tokens; /* >= 1: the input's tokens (usage) */
    uint32_t pooling;  /* 1 mean or 3 last: what the worker used */
    const uint8_t *vec;
} pd_msg_embed_result;

/* Token i (< n_tokens) of a decoded EMBED; can't fail. */
int32_t pd_msg_embed_token(const pd_msg_embed *m, uint32_t i);
/* Value i (< n_embd) of a decoded EMBED_RESULT; can't fail. */
float pd_msg_embed_value(const pd_msg_embed_result *m, uint32_t i);
/* Decoders: the layouts of docs/pd-protocol.md section 4 exactly (lengths,
 * n_tokens >= 1, pooling 0/1/3 in EMBED and 1/3 in EMBED_RESULT, n_embd in
 * range). Token ids are not checked against a vocabulary (the worker's
 * admission does that: REJECT INVALID). Errors: KS_ERR_PROTO. */
ks_err pd_msg_embed_decode(const uint8_t *payload, uint32_t len, pd_msg_embed *out,
                           ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_embed_result_decode(const uint8_t *payload, uint32_t len, pd_msg_embed_result *out,
                                  ks_errbuf *eb) KS_MUST_USE;
/* Encoders (buf NULL: size only, in *out_len). tokens: m->n_tokens of them;
 * vec: m->n_embd floats (m->tokens / m->vec ignored). Errors: KS_ERR_INVAL
 * (a field the decoder would refuse), KS_ERR_NOSPACE (cap). */
ks_err pd_msg_embed_encode(const pd_msg_embed *m, const int32_t *tokens, uint8_t *buf, size_t cap,
                           uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;
ks_err pd_msg_embed_result_encode(const pd_msg_embed_result *m, const float *vec, uint8_t *buf,
                                  size_t cap, uint32_t *out_len /* OUT */,
                                  ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Prompt logprobs (echo, issue 12): PROMPT_LP P -> R (control), for a
// PREFILL with PD_FLAG_PROMPT_LP. Record i of a message is prompt position
// first_pos + i: the prompt token there and its logprob under the logits of
// position first_pos + i - 1, with the n_top most likely alternatives there.
// Position 0 has no logprob and no record (the router knows the prompt), so
// first_pos >= 1. The records of a request arrive in position order, in
// messages of at most PD_MSG_PROMPT_LP_MAX_RECORDS; the last one carries
// PD_PROMPT_LP_LAST and ends at the prompt's end.

#define PD_MSG_PROMPT_LP_FIXED 16u
#define PD_MSG_PROMPT_LP_MAX_RECORDS 256u /* records per message */
/* Bytes of one record with n_top alternatives: {i32 token, f32 logprob, n_top x {i32, f32}}. */
#define PD_MSG_PROMPT_LP_RECORD(n_top) (8u + 8u * (uint32_t)(n_top))
/* PROMPT_LP payload bound (256 records of 64 alternatives). */
#define PD_MSG_PROMPT_LP_MAX                                                                       \
    (PD_MSG_PROMPT_LP_FIXED +                                                                      \
     PD_MSG_PROMPT_LP_MAX_RECORDS * PD_MSG_PROMPT_LP_RECORD(PD_MSG_MAX_TOP))
enum { PD_PROMPT_LP_LAST = 1u /* the request's last PROMPT_LP */ };

/* PROMPT_LP (16 + n_records (8 + 8 n_top)). Decoded: records points at the
 * n_records raw records (pd_msg_prompt_lp_record, pd_msg_prompt_lp_top). */
typedef struct pd_msg_prompt_lp {
    uint32_t first_pos; /* >= 1; first_pos + n_records <= 2^31 */
    uint32_t n_records; /* <= PD_MSG_PROMPT_LP_MAX_RECORDS; 0 only in the LAST message
                           (a one-token prompt has no record) */
    uint32_t n_top;     /* <= PD_MSG_MAX_TOP, the same in every record */
    uint32_t flags;     /* PD_PROMPT_LP_*; other bits must be 0 */
    const uint8_t *records;
} pd_msg_prompt_lp;

/* Loads record i (< n_records) of a decoded PROMPT_LP: its token and logprob.
 * Can't fail. */
void pd_msg_prompt_lp_record(const pd_msg_prompt_lp *m, uint32_t i, int32_t *token /* OUT */,
                             float *logprob /* OUT */);
/* Loads alternative k (< n_top) of record i (< n_records). Can't fail. */
pd_msg_top pd_msg_prompt_lp_top(const pd_msg_prompt_lp *m, uint32_t i, uint32_t k);
/* Decoder: the layout of docs/pd-protocol.md section 4 exactly (first_pos >=
 * 1, counts within bounds, len = 16 + n_records * (8 + 8 n_top), no unknown
 * flag, n_records 0 only with LAST). Token ids are the router's check (it
 * holds the prompt). Errors: KS_ERR_PROTO. */
ks_err pd_msg_prompt_lp_decode(const uint8_t *payload, uint32_t len, pd_msg_prompt_lp *out,
                               ks_errbuf *eb) KS_MUST_USE;
/* Encoder (buf NULL: size only). tokens, logprobs: m->n_records each; top:
 * m->n_records * m->n_top alternatives, record-major (NULL when n_top is 0);
 * m->records is ignored. Errors: KS_ERR_INVAL (what the decoder refuses),
 * KS_ERR_NOSPACE (cap). */
ks_err pd_msg_prompt_lp_encode(const pd_msg_prompt_lp *m, const int32_t *tokens,
                               const float *logprobs, const pd_msg_top *top, uint8_t *buf,
                               size_t cap, uint32_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

#endif /* KS_PD_MSG_H */
