/* engine.h — requests, admission and the continuous-batching scheduler.
 *
 * One scheduler thread owns the KV pool, the prefix cache and every running
 * sequence. Callers (HTTP threads) submit requests and pull their events;
 * they never touch model or KV state. Admission (I4) runs inside
 * engine_submit, before any page is allocated: a rejected request never
 * reaches the scheduler and has no edge out of REJECTED.
 *
 * Request states and the only legal transitions (checked at run time):
 *   QUEUED -> PREFILLING | ABORTED
 *   PREFILLING -> DECODING | FINISHED | ABORTED
 *   DECODING -> FINISHED | ABORTED
 *   (REJECTED is entered only from admission; FINISHED, REJECTED and
 *   ABORTED are terminal.) */
#ifndef KS_ENGINE_H
#define KS_ENGINE_H

#include "kvseal/base.h"
#include "kvseal/grammar.h"
#include "kvseal/kv.h"
#include "kvseal/model.h"
#include "kvseal/sample.h"

typedef enum engine_state {
    ENGINE_QUEUED = 0,
    ENGINE_PREFILLING = 1,
    ENGINE_DECODING = 2,
    ENGINE_FINISHED = 3,
    ENGINE_REJECTED = 4,
    ENGINE_ABORTED = 5,
} engine_state;

/* Name of a state ("QUEUED", ...); static storage. */
const char *engine_state_name(engine_state s);
/* True when from -> to is a legal transition (the table above). */
bool engine_transition_ok(engine_state from, engine_state to);

typedef enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP = 1,   /* EOS/EOG token or a stop string */
    ENGINE_FINISH_LENGTH = 2, /* max_tokens or the context limit */
    ENGINE_FINISH_ABORT = 3,  /* cancelled (client gone, model taken offline) */
    ENGINE_FINISH_ERROR = 4,  /* internal error, e.g. an isolation violation */
} engine_finish;

typedef struct engine engine;

typedef struct engine_opts {
    const model *m;            /* borrowed; outlives the engine */
    int n_threads;             /* compute threads */
    int32_t n_ctx;             /* per-request limit: prompt + max_tokens */
    uint32_t kv_pages;         /* pool size in pages */
    int page_tokens;           /* positions per page (16) */
    int kv_type;               /* KV element type, kv.h (KS_DTYPE_F16; F32, Q8_0) */
    kv_scrub scrub;            /* zero (default) or poison */
    int32_t max_batch_tokens;  /* tokens per forward pass; prefills are chunked to fit (256) */
    int32_t max_running;       /* sequences in the running batch (16) */
    int32_t queue_max;         /* admitted requests waiting for room (64); past it: AGAIN */
    uint32_t queue_timeout_ms; /* a queued request waiting longer is aborted (30000) */
    bool prefix_cache;         /* tenant-scoped prefix reuse (true) */
    uint32_t prefix_max_pages; /* pages the prefix cache may hold (pool/4) */
    /* structured security events (one JSON object per call, no content);
     * called on the scheduler thread */
    void (*on_security_event)(void *ctx, const char *json);
    void *event_ctx;
    /* Decode-worker hook (NULL: none). The scheduler thread calls
     * poll(poll_ctx, e, timeout_ms) once per loop iteration: with 0 while
     * requests run, and with up to 50 when idle, in place of its own wait (so
     * the hook must block up to timeout_ms for its own events, e.g. in
     * epoll). poll_end(poll_ctx, e) runs once on that thread after the final
     * abort at shutdown. engine_pool and engine_adopt may be called only from
     * inside these two. */
    void (*poll)(void *poll_ctx, engine *e, int timeout_ms);
    void (*poll_end)(void *poll_ctx, engine *e);
    void *poll_ctx;
    model_pooling pooling; /* embeddings (engine_embed_submit): DEFAULT = the model's */
    /* Grammar masks (constrained decoding) run on the engine's mask threads
     * (n_threads of them, at a lower CPU priority than the forward pass),
     * never on the scheduler thread: a step waits for this step's masks at
     * most as long as its forward pass took, and a request whose mask is not
     * ready sits the next steps out. A request whose mask takes more than
     * grammar_budget_us of CPU for one token, or grammar_cpu_us for all its
     * tokens, ends with KS_ERR_INVAL and reason ADMIT_INVALID (a 400 naming
     * the limit) as soon as the scheduler sees it over, even mid-mask. */
    uint64_t grammar_budget_us; /* per token, microseconds (1000000; 0: no limit) */
    uint64_t grammar_cpu_us;    /* per request, microseconds (20000000; 0: no limit) */
    /* Speculative decoding (docs/speculative.md): each decode step a request
     * proposes up to spec_tokens drafts, the pass computes them beside its
     * token, and the drafts the request's own draw confirms are kept: one
     * read of the weights yields several tokens, with the same tokens (and,
     * seeded, the same draws) as without speculation. Drafts come from the
     * request's own tokens (prompt lookup: the last spec_ngram_max ..
     * spec_ngram_min tokens' latest earlier occurrence) and its prediction
     * (engine_params.prediction); never from another request (I7, as the prefix cache). */
    int32_t spec_tokens;    /* drafts per step at most, 0..ENGINE_SPEC_MAX (0: off) */
    int32_t spec_ngram_min, spec_ngram_max; /* prompt-lookup n-gram sizes (2, 4) */
    int32_t spec_max_batch; /* no drafts in a step with more decoding requests (4): a
                               large batch already reads the weights once for many */
    /* A draft model (NULL: none; borrowed, outlives the engine): with
     * spec_tokens > 0, requests without a prediction draft its greedy tokens
     * instead of prompt lookup. Same vocabulary as m, no recurrent state. Its
     * KV lives in a pool of its own (draft_kv_pages pages, 0: kv_pages),
     * tagged, checked and scrubbed like the target's; a request reserves its
     * draft pages when it first drafts (none left: it does not draft). */
    const model *draft;
    uint32_t draft_kv_pages;
    /* Draft with the model's own NextN (multi-token prediction) block
     * instead (model_has_mtp: GLM-4.5+, DeepSeek-V3; not with draft): it
     * reads the model's final hidden state at each position and the next
     * token, so the engine keeps it in step with every token a request
     * computes, and its KV lives in a pool of its own as a draft model's. */
    bool spec_nextn;
    /* The caller already logged engine_capacity_check's pool line (kvseal
     * serve and the cluster roles at startup): engine_create then says it
     * at debug level only, so that it appears once. */
    bool sizing_logged;
} engine_opts;

/* Drafted tokens per step at most (engine_opts.spec_tokens). */
#define ENGINE_SPEC_MAX 8

#define ENGINE_ADAPTER_NAME_MAX 65     /* an adapter name's bytes, NUL included */
#define ENGINE_ADAPTER_DIGEST_BYTES 32 /* SHA-256 */
#define ENGINE_ADAPTERS_MAX 1024       /* adapters one engine holds */

/* Fills defaults for everything but m, n_ctx and kv_pages. Can't fail. */
void engine_opts_default(engine_opts *o);

/* Pool capacity arithmetic for `kvseal check` and the deploy-time check (I8):
 * writes a human-readable explanation to buf and returns KS_OK when one
 * request of n_ctx tokens fits (warn_out set when below 2x), or
 * KS_ERR_NOSPACE when it cannot. */
ks_err engine_capacity_check(const engine_opts *o, bool *warn_out /* OUT */, char *buf,
                             size_t cap) KS_MUST_USE;

/* Starts the scheduler thread. Errors: KS_ERR_NOSPACE (I8 check failed,
 * message gives the arithmetic), KS_ERR_NOMEM, KS_ERR_INVAL. */
ks_err engine_create(const engine_opts *o, engine **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Aborts every request, joins the scheduler, frees everything; accepts NULL.
 * Handles still held by callers stay valid until released. */
void engine_destroy(engine *e);

typedef struct engine_params {
    const char *tenant;          /* from authentication; copied */
    const char *cache_domain;    /* prefix-cache domain (I7): NULL = the tenant; an
                                    operator-declared sharing group otherwise; copied */
    const int32_t *prompt;       /* (n_prompt) token ids; copied */
    int32_t n_prompt;
    int32_t max_tokens;          /* >= 1 */
    sample_params sp;
    const char *const *stops;    /* (n_stops) stop strings; copied */
    int n_stops;
    bool ignore_eos;
    grammar *grammar; /* constrained decoding (NULL: none); borrowed, the
                         request takes its own reference. Each step, tokens
                         the grammar cannot accept get -inf before sampling
                         (so temperature, top-p etc. act on the allowed set
                         and logprobs are those of that set); EOG only when
                         the grammar is complete (even with ignore_eos);
                         generation stops (FINISH_STOP) once nothing more
                         can follow */
    /* issue 12 (the cluster router carries them too: sampling extension, PROMPT_LP) */
    const sample_bias *bias; /* (n_bias) logit_bias entries, validated; copied */
    int n_bias;
    bool prompt_logprobs; /* echo: post an ENGINE prompt event for every prompt token
                             (the logprob of token i under the logits of position i-1;
                             none for token 0) before any generated token; the prompt
                             is then computed in full (no prefix-cache attach), and
                             max_tokens may be 0 (the request ends after the prompt) */
    int32_t prompt_top;   /* [0, SAMPLE_MAX_TOP]: alternatives per prompt token */
    int32_t model;        /* the catalog entry the request is for (server_backend's: the
                             router fronts several models); the engine has one, 0 */
    /* speculative decoding (engine_opts.spec_tokens) */
    bool no_spec;                /* this request never drafts (opt-out) */
    const int32_t *prediction;   /* (n_prediction) the expected output's ids (OpenAI's
                                    predicted outputs), drafted from; copied; NULL: none */
    int32_t n_prediction;
    const char *adapter; /* LoRA adapter name (NULL or "": none), resolved at submit among the
                            tenant's own adapters and the public ones (engine_adapter_add);
                            any other name, another tenant's included, is refused alike with
                            ADMIT_ADAPTER_NOT_FOUND */
} engine_params;

typedef struct engine_req engine_req;

/* The prefix-cache / tenant domain root of a request (I7): the tenant, or
 * the operator's sharing group. Without an adapter, the prefix-cache key;
 * with one, engine_root_with_adapter of it is. Can't fail. */
void engine_domain_root(const engine_params *p, uint8_t root[KV_ROOT_BYTES] /* OUT */);
/* Mixes an adapter's digest into a domain root (in place): SHA-256 of a
 * label, the root and the digest, so no prefix computed under one adapter
 * (or none) is found under another (I7). Can't fail. */
void engine_root_with_adapter(uint8_t root[KV_ROOT_BYTES] /* IN/OUT */,
                              const uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES]);

// ----------------------------------------------------------------------------
// LoRA adapters (adapter.c): a tenant's private data
//
// Each adapter belongs to one tenant and is named within it; the admin may
// mark one public (usable by every tenant; its name then unique among the
// public ones). A request names an adapter (engine_params.adapter) and is
// resolved against its own tenant's first, then the public ones; any other
// name is "not found", whether or not another tenant has it. Requests hold
// a reference: engine_adapter_remove unlinks the adapter at once (new
// requests no longer find it) and its factors are scrubbed and freed when
// the last request using it ends. The prefix cache is keyed by the domain
// root mixed with the adapter's digest (SHA-256 of its file bytes and
// scale), so prefixes never pass between adapters, and the cluster's
// workers derive the same key from the same file.

typedef struct engine_adapter_spec {
    const char *tenant;  /* the owner (the name authentication gives); copied */
    const char *name;    /* [A-Za-z0-9._-], 1..ENGINE_ADAPTER_NAME_MAX-1 bytes, not starting
                            with '.'; unique within the owner; copied */
    bool is_public;      /* every tenant may use it */
    float scale;         /* the user scale (llama.cpp's --lora-scaled); 0 means 1 */
    const void *data;    /* (len) the adapter's GGUF file (llama.cpp's format, model.h
                            "LoRA adapters"); read during the call only */
    size_t len;
} engine_adapter_spec;

typedef struct engine_adapter_info {
    char tenant[128];
    char name[ENGINE_ADAPTER_NAME_MAX];
    bool is_public;
    float scale;                  /* the user scale */
    int32_t rank, n_mats;
    uint64_t bytes;               /* memory its factors hold */
    uint32_t running;             /* requests holding it now */
    uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES];
} engine_adapter_info;

/* Whether name is a valid adapter name (engine_adapter_spec.name's rule). Pure. */
bool engine_adapter_name_ok(const char *name);
/* The digest engine_adapter_add gives the adapter of (data, len) at scale
 * (0 means 1): SHA-256 of the bytes and the scale as a little-endian f32.
 * Can't fail. */
void engine_adapter_digest(const void *data, size_t len, float scale,
                           uint8_t out[ENGINE_ADAPTER_DIGEST_BYTES] /* OUT */);
/* Loads the adapter of s against the engine's model and registers it.
 * Errors: KS_ERR_INVAL (a bad name or scale), KS_ERR_EXISTS (the owner
 * already has that name; a public adapter of that name exists),
 * KS_ERR_NOSPACE (ENGINE_ADAPTERS_MAX reached),
 * model_lora_load's (KS_ERR_FORMAT, KS_ERR_UNSUPPORTED: the file does not
 * fit the model), KS_ERR_NOMEM. Blocks while it loads; thread-safe. */
ks_err engine_adapter_add(engine *e, const engine_adapter_spec *s, ks_errbuf *eb) KS_MUST_USE;
/* Unregisters tenant's adapter name (its own, not a public one of another
 * owner); the memory is scrubbed and freed once no request holds it.
 * Errors: KS_ERR_INVAL with reason ADMIT_ADAPTER_NOT_FOUND. Thread-safe. */
ks_err engine_adapter_remove(engine *e, const char *tenant, const char *name,
                             ks_errbuf *eb) KS_MUST_USE;
/* Writes up to cap registered adapters (oldest first) to out and returns
 * how many there are; tenant non-NULL: only those it may use. Can't fail. */
int engine_adapter_list(engine *e, const char *tenant, engine_adapter_info *out, int cap);
/* Whether tenant may use an adapter named name (its own or a public one). */
bool engine_adapter_visible(engine *e, const char *tenant, const char *name);

/* Admission, then enqueue. On success *out is a handle owned by the caller
 * (engine_req_release). Rejections never touch the pool:
 *   KS_ERR_INVAL  — context_length_exceeded (message: "This model's maximum
 *                   context length is N tokens. However, you requested M
 *                   tokens (P in the prompt, K for the completion)."),
 *                   empty prompt, token id out of range, bad sampling params;
 *   KS_ERR_NOSPACE — prompt + max_tokens can never fit the pool;
 *   KS_ERR_AGAIN  — the wait queue is full, or the engine is offline (503).
 * Thread-safe; does not block on the scheduler. */
ks_err engine_submit(engine *e, const engine_params *p, engine_req **out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;

#define ENGINE_MAX_N 16 /* most choices of one request (n, best_of) */

/* n choices of one prompt (OpenAI's n / best_of): out[i] (n handles, each
 * owned by the caller as engine_submit's) generates choice i with its own
 * sampler seeded p->sp.seed + i (mod 2^64), so choice i's tokens equal an
 * n=1 request's with that seed. The prompt is computed once: choice 0
 * prefills it; the others then share its full prompt pages read-only
 * (reference-counted, keeping choice 0's tags, I1) and compute only the
 * prompt's last page themselves. Every page each choice can need is
 * reserved when the group is admitted, all together (the group waits at
 * the head of the queue until they all fit). prompt_logprobs applies to
 * choice 0 only. Errors: engine_submit's, and KS_ERR_INVAL for n outside
 * [1, ENGINE_MAX_N], n above max_running, or max_tokens 0 with n > 1;
 * KS_ERR_NOSPACE when the group's pages (the shared prompt pages once plus
 * every choice's own) can never fit the pool. On error no handle exists.
 * Thread-safe. */
ks_err engine_submit_n(engine *e, const engine_params *p, int n, engine_req **out /* OUT: (n) */,
                       ks_errbuf *eb) KS_MUST_USE;

#define ENGINE_TEXT_CAP 512

typedef struct engine_event {
    bool done;                  /* last event of the request */
    int32_t token;              /* generated id, or -1 (text-only / done event) */
    bool prompt;                /* a prompt token's event (engine_params.prompt_logprobs):
                                   token and sr.logprob/top_* are the prompt's, no text */
    bool no_logprob;            /* prompt token 0: it has no logprob (OpenAI's null) */
    sample_result sr;           /* logprobs of token (when requested) */
    char text[ENGINE_TEXT_CAP]; /* UTF-8 text now safe to send (stop strings held back) */
    size_t text_len;
    /* on done: */
    engine_finish finish;
    engine_state state;         /* FINISHED or ABORTED */
    ks_err err;                 /* KS_OK unless finish is ERROR/ABORT */
    uint16_t reason;            /* REJECTED: the refusal reason (admit_reason), else 0 */
    char errmsg[256];
    int32_t n_prompt, n_gen;    /* usage */
    int32_t n_cached;           /* prompt tokens served from the prefix cache */
    int32_t n_drafted, n_accepted; /* speculative decoding: drafts computed, and kept */
    double ttft_ms;             /* submit -> first token */
    double queue_ms;            /* submit -> left the wait queue (scheduled); -1: never
                                   scheduled (refused, or aborted while waiting) */
    double mask_ms;             /* CPU its grammar masks took (the tenant's to pay) */
} engine_event;

/* Waits up to timeout_ms for the next event. KS_OK: *ev filled; KS_ERR_TIMEOUT:
 * nothing yet; KS_ERR_CANCELLED: the done event was already consumed.
 * Thread-safe w.r.t. the scheduler; one consumer per request. */
ks_err engine_req_next(engine_req *r, engine_event *ev /* OUT */, uint32_t timeout_ms) KS_MUST_USE;
/* Aborts the request (client disconnected); its pages are freed within one
 * scheduler step. Idempotent; thread-safe. */
void engine_req_cancel(engine_req *r);
/* Drops the caller's handle (cancels first if still running). */
void engine_req_release(engine_req *r);
/* engine_stream_set_notify on the request's events: for callers that wait
 * without blocking a thread (an event loop). Thread-safe. */
void engine_req_set_notify(engine_req *r, void (*notify)(void *ctx), void *ctx);
/* The request's current state; thread-safe. */
engine_state engine_req_state(const engine_req *r);

/* The engine's KV pool. Only from inside engine_opts.poll / poll_end (the
 * scheduler thread owns it); can't fail. */
kv_pool *engine_pool(engine *e);

/* A request whose prompt KV was computed elsewhere (a decode worker's
 * verified handoff, docs/pd-protocol.md section 6). */
typedef struct engine_adopt_args {
    const char *tenant;    /* copied; for logs and security events */
    int32_t n_prompt;      /* positions [0, n_prompt) of seq hold the prompt's KV */
    int32_t max_tokens;    /* >= 1, counting first_token */
    sample_params sp;      /* validated; seed as the prefill side used */
    bool ignore_eos;
    kv_seq *seq;           /* borrowed: filled with n_prompt READY positions and
                              reserved for n_prompt + max_tokens; the engine never
                              releases it and stops touching it once the request's
                              done event is posted */
    sample_result first;   /* the first token (first.token) and its logprobs, sampled
                              by the prefill side from the last prompt position */
    uint64_t rng_draws;    /* sampler_draws() after the first token, on the prefill side */
    grammar *grammar;      /* constrained decoding as engine_params.grammar (NULL: none);
                              borrowed; first.token must be one it accepts (or an EOG id
                              when its text is complete) and advances it */
    const sample_bias *bias; /* (n_bias) logit_bias, validated here; copied */
    int n_bias;
    const char *adapter;   /* LoRA adapter name as engine_params.adapter (NULL: none),
                              resolved under tenant */
} engine_adopt_args;

/* Starts generation of an adopted request at once in DECODING: the first
 * token is handled exactly as the engine handles a token it sampled itself
 * (EOS ends it with FINISH_STOP and n_gen 0, else it is posted as the first
 * event and counts toward max_tokens), and the sampler continues from
 * rng_draws, so the tokens equal what engine_submit would have produced.
 * Stop strings are not applied (the caller's). Only from inside
 * engine_opts.poll (asserted); a done event may already be queued on
 * return (first token EOS, or max_tokens 1). *out as engine_submit. Errors:
 * KS_ERR_INVAL (bad params, a token id out of range, rng_draws above n_ctx,
 * seq with fewer than n_prompt filled positions or too few pages, a first
 * token the grammar refuses, bad bias entries),
 * KS_ERR_AGAIN (max_running reached or offline), KS_ERR_NOMEM. */
ks_err engine_adopt(engine *e, const engine_adopt_args *a, engine_req **out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;

/* Takes the engine offline (new submits get KS_ERR_AGAIN "offline"; with
 * abort_running, running requests are aborted, else they finish) or back
 * online. Thread-safe. */
void engine_set_online(engine *e, bool online, bool abort_running);
bool engine_is_online(const engine *e);

/* Waits (up to timeout_ms) until no request is queued or running, then has
 * the scheduler drop the prefix cache and verify that every page is FREE
 * and scrubbed (I3). KS_OK when clean; KS_ERR_INTERNAL with the page counts
 * in eb when not; KS_ERR_TIMEOUT when requests were still active. For the
 * leak suite and the admin route; thread-safe. */
ks_err engine_check_quiescent(engine *e, uint32_t timeout_ms, ks_errbuf *eb) KS_MUST_USE;

/* The admin page's map of the model's KV pool: every page's state and the
 * tenant whose running request holds it. Owner names are for the admin
 * alone (the route that shows them takes the admin key). */
enum { ENGINE_MAP_OWNERS = 64 };
enum {
    ENGINE_MAP_FREE = -1,   /* no owner: FREE */
    ENGINE_MAP_CACHED = -2, /* held by the prefix cache only, or a sequence no running
                               request names (an adopted transfer, a queued resume) */
    ENGINE_MAP_OTHER = -3   /* a running request past ENGINE_MAP_OWNERS tenants */
};
typedef struct engine_map {
    uint32_t n_pages; /* pages of the model pool */
    uint8_t *state;   /* (n_pages) kv_page_state */
    int8_t *owner;    /* (n_pages) index into tenant[], or ENGINE_MAP_* */
    int n_tenants;
    char tenant[ENGINE_MAP_OWNERS][128];
    uint32_t running[ENGINE_MAP_OWNERS]; /* running requests of each tenant */
} engine_map;
/* Snapshots the pool's pages on the scheduler thread between two steps
 * (each page's header only, never a payload byte). KS_ERR_TIMEOUT when the
 * scheduler did not get to it within timeout_ms; KS_ERR_NOMEM. Thread-safe;
 * the caller frees *out with engine_map_free. */
ks_err engine_map_pages(engine *e, uint32_t timeout_ms, engine_map **out /* OUT */,
                        ks_errbuf *eb) KS_MUST_USE;
/* Frees a map; accepts NULL. */
void engine_map_free(engine_map *m);

// ----------------------------------------------------------------------------
// Event streams: what engine_req_next reads, reusable by other producers
// (the cluster router), so that every front end emits the same events.

typedef struct engine_stream engine_stream;

/* Creates an empty stream whose text passes through stop strings
 * stops[0..n_stops) (copied; n_stops may be 0). Errors: KS_ERR_INVAL (a bad
 * stop string), KS_ERR_NOMEM. *out owned by the caller. */
ks_err engine_stream_create(const char *const *stops, int n_stops, engine_stream **out /* OUT */,
                            ks_errbuf *eb) KS_MUST_USE;
/* Frees the stream and undelivered events; accepts NULL. */
void engine_stream_destroy(engine_stream *s);
/* Appends ev (copied); wakes the consumer. Never drops a done event (a text
 * event may be dropped on out-of-memory). Thread-safe. */
void engine_stream_post(engine_stream *s, const engine_event *ev);
/* engine_req_next's contract on this stream. Thread-safe (one consumer). */
ks_err engine_stream_next(engine_stream *s, engine_event *ev /* OUT */, uint32_t timeout_ms) KS_MUST_USE;
/* True once the done event was posted. Thread-safe. */
bool engine_stream_done_posted(engine_stream *s);
/* Undelivered events at which a producer holds its request back: a client
 * that stops reading pauses its generation (its pages stay reserved)
 * instead of growing the server's memory without bound. */
#define ENGINE_STREAM_BACKLOG 32
/* Producer side: true when the consumer has ENGINE_STREAM_BACKLOG or more
 * events still to take. Each true answer arms the wake hook, which then
 * runs once, on the consumer's thread, when the consumer has taken the
 * backlog down to half. Thread-safe. */
bool engine_stream_backlogged(engine_stream *s);
/* Sets the hook engine_stream_backlogged arms (NULL: none); call before the
 * stream is shared. The hook must not call back into this stream. */
void engine_stream_set_wake(engine_stream *s, void (*wake)(void *ctx), void *ctx);
/* Consumer side: has notify(ctx) called after every event posted from now
 * on (NULL: none), on the producer's thread and under the stream's lock, so
 * once this returns with NULL no call is running or will start. notify
 * must be quick and must not call into this stream. Thread-safe. */
void engine_stream_set_notify(engine_stream *s, void (*notify)(void *ctx), void *ctx);
/* Producer side: detokenizes sr->token (vocabulary v), runs the text through
 * the stop strings and posts what is safe to send now, with the token and
 * its logprobs. *matched: a stop string matched (generation must end).
 * piece is scratch of cap >= tok_stream_bound(v) bytes. Errors: KS_ERR_NOMEM
 * (nothing posted). One producer thread. */
/* min_tokens (sample_params): the text of the first min_tokens - 1 tokens
 * passes engine_stream_token without the stop strings, which are looked for
 * from the min_tokens-th token's text on. Call before the first token.
 * Can't fail. */
void engine_stream_set_min_tokens(engine_stream *s, int32_t min_tokens);
/* min_tokens (sample_params): while fewer than min_tokens tokens were
 * generated (n_gen), every end-of-generation id of v gets -inf in logits
 * (n_vocab floats) before sampling, so EOG cannot end generation early
 * (vLLM's meaning). A no-op once n_gen >= min_tokens. Can't fail. */
void engine_ban_eog(const tok_vocab *v, int32_t min_tokens, int32_t n_gen, float *logits,
                    int32_t n_vocab);
ks_err engine_stream_token(engine_stream *s, const tok_vocab *v, const sample_result *sr, char *piece,
                           size_t cap, bool *matched /* OUT */) KS_MUST_USE;
/* Producer side, at a normal finish: posts what the detokenizer and the stop
 * matcher still hold. Can't fail. */
void engine_stream_flush(engine_stream *s, char *piece, size_t cap);

/* How a request ended, for engine_stream_finish. */
typedef struct engine_outcome {
    engine_state state;      /* FINISHED, REJECTED or ABORTED */
    engine_finish finish;
    ks_err err;
    uint16_t reason;         /* REJECTED: the refusal reason (admit_reason), else 0 */
    const char *msg;         /* NULL: none */
    int32_t n_prompt, n_gen, n_cached;
    int32_t n_drafted, n_accepted;    /* speculative decoding */
    uint64_t t_submit_ns, t_first_ns; /* t_first_ns 0: no token */
    uint64_t t_sched_ns;              /* left the wait queue; 0: never */
    uint64_t mask_ns;                 /* CPU of its grammar masks */
} engine_outcome;
/* Producer side, last call: on a STOP/LENGTH finish posts what is still held
 * back (engine_stream_flush), then the done event for o. Can't fail. */
void engine_stream_finish(engine_stream *s, const engine_outcome *o, char *piece, size_t cap);

typedef struct engine_stats {
    kv_stats kv;
    uint32_t n_queued, n_running;
    uint32_t n_paused;     /* running, but skipped: the client has not taken its output
                              (engine_stream_backlogged) */
    uint64_t n_finished, n_aborted, n_rejected;
    uint64_t tokens_in, tokens_out;
    uint64_t n_violations; /* sequences stopped by a KV page check (I1), once each;
                              kv.violations counts every failed check */
    uint64_t spec_steps;    /* speculative decoding: request-steps that carried drafts */
    uint64_t spec_drafted;  /* drafted tokens computed */
    uint64_t spec_accepted; /* drafted tokens kept (the rest were scrubbed at once) */
    uint32_t adapters;      /* LoRA adapters registered */
    uint64_t adapter_bytes; /* memory their factors hold (removed ones still in use included) */
    uint64_t adapter_requests; /* requests admitted with an adapter */
} engine_stats;
/* Snapshot; thread-safe. */
void engine_get_stats(engine *e, engine_stats *out /* OUT */);

// ----------------------------------------------------------------------------
// Embeddings: a prompt-only request kind
//
// An embedding request runs its input through the forward pass like a
// prompt (its own sequence, its own tagged pages, I1-I3; chunked and
// batched with whatever else runs), asks for every position's hidden row
// (model_forward_hidden) and pools them (model_embd_*) on the scheduler
// thread. It never reads or feeds the prefix cache (mean pooling needs
// every position's row, and an embedding never shares KV across requests).
// When the last position is computed its pages are released (scrubbed, I3)
// and the done event is posted (FINISHED, FINISH_STOP, n_gen 0); the vector
// is then read with engine_req_embedding. Pooling lives here and in the
// model module, not in the HTTP front, so the cluster's prefill worker
// pools the same rows the same way (bit-identical vectors).

typedef struct engine_embed_params {
    const char *tenant;    /* from authentication; copied */
    const int32_t *tokens; /* (n_tokens) the input's ids; copied */
    int32_t n_tokens;
    model_pooling pooling; /* DEFAULT: engine_opts.pooling */
    int32_t model;         /* catalog entry, as engine_params.model (engine: 0) */
} engine_embed_params;

/* Admission (admit_embed: empty input INVAL, above n_ctx tokens
 * context_length_exceeded, ids out of range, pages above the pool) then
 * enqueue, as engine_submit; *out owned by the caller (engine_req_release),
 * its events read with engine_req_next (one done event). Errors as
 * engine_submit's. Thread-safe. */
ks_err engine_embed_submit(engine *e, const engine_embed_params *p, engine_req **out /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;
/* Copies the pooled, L2-normalized vector of an embedding request whose done
 * event was taken with state FINISHED into out (cap >= n_embd floats).
 * Errors: KS_ERR_INVAL (not an embedding request, not finished, cap too
 * small). Thread-safe after the done event. */
ks_err engine_req_embedding(engine_req *r, float *out /* OUT */, int32_t cap) KS_MUST_USE;

#endif /* KS_ENGINE_H */
