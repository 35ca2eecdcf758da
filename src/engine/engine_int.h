/* engine_int.h — the engine's private layout, shared by its files:
 * engine.c (the scheduler thread: the fair queue, the step, the lifecycle),
 * request.c (request objects: submit, adopt, embeddings, events, cancel,
 * and a request's end) and mask.c (grammar masks on the mask threads).
 * Each struct field says which thread owns it; see engine.h for the
 * contract and the header of engine.c for how a step runs. */
#ifndef KS_ENGINE_INT_H
#define KS_ENGINE_INT_H

#include "kvseal/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* A registered LoRA adapter (adapter.c); immutable once registered. */
typedef struct engine__adapter {
    atomic_int refs;   // the registry's (until removed) + one per request holding it
    char tenant[128];  // the owner
    char name[ENGINE_ADAPTER_NAME_MAX];
    bool pub;          // every tenant may use it
    float scale;
    model_lora *lora;
    uint64_t bytes;    // model_lora_bytes
    uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES]; // SHA-256 of the file and the scale
    struct engine__adapter *next; // e->adapters, oldest first (e->amu)
} engine__adapter;

struct engine_req {
    atomic_int refs;  // the caller's handle + the scheduler's
    engine *e;
    uint64_t id;
    // immutable after submit
    char tenant[128];
    uint8_t root[KV_ROOT_BYTES];  // prefix-cache key: the tenant's domain and adapter (I7)
    engine__adapter *adapter;     // its LoRA adapter (a reference; NULL: none), dropped when
                                  // the request ends (engine__req_drop_adapter)
    int32_t *prompt;              // (n_prompt)
    int32_t n_prompt, max_tokens;
    sample_params sp;
    bool ignore_eos;
    uint64_t t_submit;
    uint64_t t_first;  // first token sampled (0 = not yet)
    uint64_t t_sched;  // left the wait queue (0 = not yet): queue time for /metrics
    // scheduler-owned
    atomic_int state;  // engine_state, readable from any thread
    kv_seq seq;
    bool has_seq;      // seq holds pages the engine must release
    kv_seq *ext;       // adopted requests: the caller's sequence (borrowed, never released)
    sampler *smp;
    grammar_matcher *gm; // NULL: unconstrained
    uint32_t *gmask;     // ((V + 31) / 32) allowed tokens this step
    // grammar masks on the mask threads (engine__mask_*): while a job is
    // queued or running, its thread owns gm, smp, gmask, mlogits and the
    // results below; the scheduler reads them once it saw the job DONE
    // (under e->mmu), and then owns them again
    atomic_int mstate;          // ENGINE__MASK_IDLE, _QUEUED, _RUNNING, _DONE
    bool mpending;              // scheduler-owned: posted, not yet collected
    uint64_t mstep;             // scheduler-owned: the step that posted it (e->n_steps)
    struct engine_req *mnext;   // mask queue link (e->mmu)
    float *mlogits;             // (V) the step's logits row, copied: e->logits is reused
    sample_result msr;          // the job's result
    bool mend;
    ks_err merr;
    uint16_t mreason;           // merr's refusal reason (ADMIT_INVALID: the grammar's fault), or 0
    char mmsg[512];
    clockid_t mclk;             // RUNNING: its thread's CPU clock, and the reading at the start
    uint64_t mcpu0;
    uint64_t mlast_ns, mask_ns; // CPU of the last mask and of them all (e->mmu)
    int32_t n_past;    // prompt tokens computed (or attached from the cache)
    int32_t n_cached;  // prompt tokens attached from the prefix cache
    int32_t snap_at;   // hybrid models: the page boundary whose state the prefix cache keeps and the group's other choices copy (0: none)
    int32_t n_gen;
    int32_t last;      // last sampled token, fed next step
    int batch_slot;    // index in this step's seqs[], -1 if not in the batch
    int out_row;       // logits row this step, -1 if none
    struct engine_req *next;  // waiting / running list link
    engine_stream *out;  // events, detokenizer, stop strings (thread-safe)
    atomic_bool cancelled;
    // issue 12: prompt logprobs (echo) and choice groups (n, best_of); scheduler-owned
    bool prompt_lp;        // post a prompt event per prompt token (engine_params.prompt_logprobs)
    int32_t prompt_top;    // alternatives per prompt token
    int32_t lp_row0;       // this step: logits row of position lp_pos0 (rows are consecutive)
    int32_t lp_pos0, lp_n; // this step's prompt positions with a logits row; lp_n 0: none
    struct engine_req *leader; // choice > 0 not forked yet: the choice 0 prefilling the prompt
    struct engine_req *fol[ENGINE_MAX_N - 1]; // choice 0: the choices waiting for its prompt
    int n_fol;
    bool orphan; // its choice 0 ended before computing the prompt: abort it at the next step
    // embeddings (engine_embed_submit); scheduler-owned until the done event
    model_pooling embed;     // MEAN or LAST: an embedding request; DEFAULT: a generation
    model_embd_acc ea;       // the pooled state, over eacc
    double *eacc;            // (n_embd)
    float *evec;             // (n_embd) the result, written before the done event
    int32_t hid_row0, hid_n; // this step: its hidden rows (consecutive), hid_n 0: none
    // speculative decoding (spec.c); scheduler-owned
    bool spec;               // drafts (engine_opts.spec_tokens, not opted out, no grammar)
    int32_t *gen;            // (max_tokens) the tokens taken so far, for prompt lookup; NULL: !spec
    int32_t *pred;           // (n_pred) the prediction's ids, or NULL
    int32_t n_pred;
    int32_t pred_at;         // the prediction's id expected next, -1: out of step with it
    int32_t spec_k;          // drafts to ask for next step (adapts to what is kept)
    int32_t spec_rest;       // decode steps left without drafts (engine__spec_adapt)
    int32_t spec_rest_len;   // the last rest's length, doubling while single drafts fail
    int32_t n_draft;         // this step: drafts in the batch after `last`, 0: none
    int32_t draft[ENGINE_SPEC_MAX];
    int32_t n_drafted, n_accepted; // totals, reported in the done event
    kv_seq dseq;             // draft model: its KV of this request (e->dpool)
    bool has_dseq;           // dseq holds pages the engine must release
    uint64_t d_uid;          // dseq's last identity, kept past its release (security events)
    uint32_t d_valid;        // dseq's positions [0, d_valid) hold the request's own tokens
    int32_t n_dm;            // this step: drafts the draft model wrote to draft[], 0: none
    int32_t dm_want;         // this step: drafts asked of the draft model
    // NextN drafting (engine_opts.spec_nextn): dseq's position j is the head's
    // slot m_base + j, which reads the model's hidden row of position
    // m_base + j and the token after it
    int32_t m_base;          // the first position the head saw (after a cached prefix)
    int32_t mh_row0, mh_pos0, mh_n; // last step: its hidden rows (e->hidden), their positions
    int32_t m_row;           // this step's latest head pass: its hidden-out row (e->m_hout)
    bool m_lost;             // the head missed a position: it drafts by lookup from here on
};

typedef struct {
    uint64_t seq_uid;
    uint32_t page;
    kv_tag expected, found;
    kv_page_state state;
} engine__violation;

struct engine {
    engine_opts o;
    const model *m;
    const tok_vocab *vocab;
    int32_t V;
    bool encoder; /* the model is a bidirectional encoder (model_hparams.encoder) */
    kv_pool *pool;
    kv_prefix *prefix;
    model_ctx *ctx;
    pthread_t thread;
    pthread_t sched_tid;  // set by the scheduler thread itself before the first hook call
    int in_hook;          // scheduler-owned: 1 inside o.poll, 2 inside o.poll_end, else 0
    // shared with submitters (mu)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    engine_req *wait_head, *wait_tail;  // QUEUED, FIFO
    uint32_t n_waiting;
    bool stop;
    uint64_t kick;       // bumped (with a broadcast) by everything the scheduler must see
    atomic_bool online;
    atomic_bool abort_all;
    atomic_ullong next_id;
    // scheduler-owned
    engine_req **running;  // (max_running)
    int n_running;
    float *logits;                           // (max_running + ENGINE__PROMPT_ROWS, V)
    float *hidden;                           // (max_batch_tokens, n_embd) embeddings' rows
    int32_t *b_hid;                          // (max_batch_tokens) hidden row per token, or -1
    int32_t *b_tok, *b_pos, *b_seq, *b_out;  // (max_batch_tokens)
    kv_seq **b_seqs;       // (max_running)
    ks_err *b_err;         // (max_running)
    char *piece;           // (piece_cap) detokenizer output
    size_t piece_cap;
    grammar_vocab *gvocab; // token trie, built at the first constrained request
    // mask threads (engine__mask_main): queued jobs, one per request at most
    pthread_t *mthreads;    // (n_mthreads)
    int n_mthreads;
    pthread_mutex_t mmu;
    pthread_cond_t mcv;     // a job was queued, or stop
    pthread_cond_t mdone;   // a job is done
    engine_req *mq_head, *mq_tail;
    bool mstop;
    uint64_t n_steps;            // scheduler-owned: forward passes run
    uint8_t *m_act;              // (max_running) engine__mask_collect's scratch
    uint64_t *m_last, *m_total;  // (max_running)
    // isolation violations reported by kv during a pass (any thread)
    pthread_mutex_t vmu;
    engine__violation viol[16];
    int n_viol;
    uint64_t seen_uid[64];  // sequences already reported (ring): one violation per sequence
    int n_seen;
    atomic_ullong n_violations;
    // stats
    atomic_ullong n_finished, n_aborted, n_rejected, tokens_in, tokens_out;
    atomic_ullong spec_steps, spec_drafted, spec_accepted;
    // draft model (engine_opts.draft, or the NextN head; NULL: none); scheduler-owned
    model *mtp;                             // the NextN head (engine_opts.spec_nextn), owned
    float *m_hin, *m_hout;                  // (max_batch_tokens, E) its hidden rows in, out
    kv_pool *dpool;
    model_ctx *dctx;
    float *dlogits;                         // (max_running, V)
    int32_t *d_tok, *d_pos, *d_seq, *d_out; // (max_batch_tokens)
    kv_seq **d_seqs;                        // (max_running)
    ks_err *d_err;                          // (max_running)
    engine_req **d_req;                     // (max_running) the drafting requests of a pass
    atomic_uint st_queued, st_running, st_paused;
    // engine_check_quiescent handshake (mu)
    int check_state;  // 0 idle, 1 requested, 2 answered
    bool check_clean;
    char check_msg[256];
    engine_map *map_out; // engine_map_pages: the map asked for (NULL: none); filled by the
                         // scheduler, which then clears it
    // LoRA adapters (adapter.c)
    pthread_mutex_t amu;
    engine__adapter *adapters;  // registered, oldest first (amu)
    atomic_uint n_adapters;
    atomic_ullong adapter_bytes, adapter_requests;
    const model_lora **b_lora;  // (max_running) this step's adapter per sequence
    atomic_bool prefix_flush;   // an adapter was freed: the scheduler drops the unused prefixes
#ifdef KS_TEST_FAULTS
    bool fault_done;
#endif
};

/* Logits rows per step for prompt logprobs (echo), past the one row per
 * running request: a prompt-logprobs prefill is chunked to fit them, so
 * the buffer stays fixed (no allocation on the step) at the cost of more
 * steps for long echoed prompts. */
#define ENGINE__PROMPT_ROWS 64

/* A mask job's state (engine_req.mstate). */
enum { ENGINE__MASK_IDLE, ENGINE__MASK_QUEUED, ENGINE__MASK_RUNNING, ENGINE__MASK_DONE };

// ----------------------------------------------------------------------------
// Request objects and a request's end (request.c)

/* Drops one reference to r; the last frees it (its pages must be released
 * already). Any thread. */
void engine__req_unref(engine_req *r);
/* Moves r to state to; asserts the move is in the table
 * (engine_transition_ok). Scheduler thread. */
void engine__set_state(engine_req *r, engine_state to);
/* The block table the step works on: the borrowed one for adopted requests. */
kv_seq *engine__seq(engine_req *r);
/* engine_stream wake hook (ctx: the engine): wakes the scheduler, e.g. when
 * a paused request's client caught up or a mask job is done. Any thread. */
void engine__wake(void *ctx);
/* Ends a request: releases its pages (exactly once), posts the done event
 * with reason (an admit_reason, 0: none), drops the scheduler's reference.
 * Scheduler thread; r may be freed on return. */
void engine__finish_reason(engine *e, engine_req *r, engine_state to, engine_finish fin,
                           ks_err err, uint16_t reason, const char *msg);
/* engine__finish_reason without a refusal reason. */
void engine__finish(engine *e, engine_req *r, engine_state to, engine_finish fin, ks_err err,
                    const char *msg);
/* Handles one chosen token of r (sampled here, or by a prefill worker for an
 * adopted request): EOS, penalty history, text, stop strings, max_tokens.
 * Returns true if r finished. Scheduler thread. */
bool engine__take(engine *e, engine_req *r, const sample_result *sr);
/* clk's reading in nanoseconds (0 if it cannot be read). */
uint64_t engine__clock_ns(clockid_t clk);

// ----------------------------------------------------------------------------
// LoRA adapters (adapter.c)

/* Drops a reference to a (accepts NULL); the last scrubs and frees it. Any thread. */
void engine__adapter_unref(engine *e, engine__adapter *a);
/* The adapter tenant's request named name resolves to (*out a reference;
 * NULL with KS_OK when name is NULL or empty). Errors: KS_ERR_INVAL with
 * reason ADMIT_ADAPTER_NOT_FOUND. Any thread. */
ks_err engine__adapter_resolve(engine *e, const char *tenant, const char *name,
                               engine__adapter **out /* OUT */, ks_errbuf *eb);
/* Drops the registry's references (engine_destroy, after every request ended). */
void engine__adapters_free(engine *e);

// ----------------------------------------------------------------------------
// Speculative decoding's drafts (spec.c)

/* Sets r up to speculate when the engine does and p lets it (r->spec; its
 * history and prediction buffers). Errors: KS_ERR_NOMEM. Before the
 * request is queued. */
ks_err engine__spec_init(engine *e, engine_req *r, const engine_params *p, ks_errbuf *eb);
/* Writes up to k (and r->spec_k) drafts to follow r->last into r->draft
 * and returns how many (0: none found). Scheduler thread. */
int32_t engine__spec_draft(engine *e, engine_req *r, int32_t k);
/* Records tok, just taken as r's n_gen-th token, in its history and
 * prediction cursor. A no-op when r does not speculate. */
void engine__spec_taken(engine_req *r, int32_t tok);
/* Longest rest of a request whose single drafts keep failing (steps). */
#define ENGINE__SPEC_REST_MAX 32
/* After a verify: r drafted `drafted` tokens and kept `kept`; sets how many
 * it asks for next (r->spec_k, 1..spec_tokens), and, drafting with a draft
 * model or NextN, after a lost single draft how many steps it rests
 * (r->spec_rest: 2, 4, .. 32). */
void engine__spec_adapt(const engine *e, engine_req *r, int32_t drafted, int32_t kept);
/* The draft model's part of a step (e->draft set): for every request of
 * the running set that will decode and draft this step, catches its draft
 * KV up with its tokens and drafts up to its spec_k greedy tokens
 * (r->n_dm), in spec_k batched passes of the draft model. Scheduler thread. */
void engine__spec_dmodel(engine *e, bool drafting);
/* The NextN head's part of a step (e->mtp set), before the batch is built:
 * runs the head over every position the last step computed for a request
 * (its hidden rows, mh_n of them), then, for a request that will decode
 * and draft now, chains up to spec_k greedy drafts (r->n_dm), each pass
 * reading the previous one's hidden row. A request that sat the last step
 * out keeps the drafts it had. Scheduler thread. */
void engine__spec_mtp(engine *e, bool drafting);
/* Creates the draft model's (or the NextN head's: spec_nextn) pool,
 * context and buffers (engine_create). Errors: KS_ERR_INVAL (vocabularies
 * differ, a recurrent draft model, no NextN block), KS_ERR_NOMEM and the
 * pool's and context's own. */
ks_err engine__spec_dmodel_create(engine *e, ks_errbuf *eb);
/* Frees them; accepts what a failed create left. */
void engine__spec_dmodel_free(engine *e);
/* Releases r's draft pages (exactly once). */
void engine__spec_release(engine *e, engine_req *r);

// ----------------------------------------------------------------------------
// Grammar masks (mask.c)

/* A mask thread (pthread start routine, arg: the engine): takes jobs,
 * least-served request first, until e->mstop. */
void *engine__mask_main(void *arg);
/* Queues r's draw from logits_row (copied). Returns true if r finished
 * instead (no token trie: out of memory). Scheduler thread. */
bool engine__mask_post(engine *e, engine_req *r, const float *logits_row);
/* Collects the running set's done jobs (their tokens) and ends requests
 * whose running job is already over a budget; finished requests leave the
 * running set. Scheduler thread. */
void engine__mask_collect(engine *e);
/* Waits until every job of the running set that this step posted is done
 * (any: one job of any step), or until deadline_ns (ks_now_ns clock).
 * Scheduler thread. */
void engine__mask_wait(engine *e, uint64_t deadline_ns, bool any);

#endif /* KS_ENGINE_INT_H */
