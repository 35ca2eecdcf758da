/* router_backend.c — the router's HTTP-thread side (cluster.h): the
 * server_backend that `kvseal router`'s HTTP front runs on unchanged.
 * rt__submit and rt__embed_submit do the same admission as engine_submit
 * and engine_embed_submit (I4: a rejected request never reaches a worker),
 * build the request and post it to the loop thread (rt__on_submit in
 * router.c), which owns it from there; cancel, online/offline and the
 * cluster-wide pool check reach the loop the same way, by pd_loop_post or
 * the check handshake under r->mu. Events come back through each request's
 * engine_stream. */
#include "router_int.h"

#include "kvseal/admit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Request events (engine_stream, any thread)

static ks_err rt__next(void *req, engine_event *ev, uint32_t timeout_ms) {
    return engine_stream_next(((rt_req *)req)->out, ev, timeout_ms);
}

static void rt__set_notify(void *req, void (*notify)(void *ctx), void *ctx) {
    engine_stream_set_notify(((rt_req *)req)->out, notify, ctx);
}

// ----------------------------------------------------------------------------
// LoRA adapters: the table the tenants file fills (any thread, under amu)
//
// The same visibility rule as the engine's (src/engine/adapter.c): a name
// resolves among the tenant's own adapters first, then the public ones; any
// other name is "not found" in the same words whether or not another tenant
// has it, after a scan of the whole table. What a request carries to the
// workers is the adapter's digest, never its name or owner.

void cluster_router_adapters_seal(cluster_router *r) {
    pthread_mutex_lock(&r->amu);
    r->adapters_sealed = true;
    pthread_mutex_unlock(&r->amu);
    // a worker may have registered before the table was complete
    if (pd_loop_post(r->loop, rt__on_adapters_sealed, r) != KS_OK)
        ks_log(KS_LOG_ERROR, "router: out of memory re-checking the workers' adapters");
}

/* server_backend.adapter_add: records (tenant, name, public, digest) for
 * catalog entry mi; the file's bytes are only hashed. */
static ks_err rt__adapter_add(void *impl, int mi, const engine_adapter_spec *sp, ks_errbuf *eb) {
    cluster_router *r = impl;
    const char *tenant = sp->tenant ? sp->tenant : "default";
    if (mi < 0 || mi >= r->n_models) return ks_seterr(eb, KS_ERR_INVAL, "no catalog entry %d", mi);
    if (!engine_adapter_name_ok(sp->name))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "adapter name '%.64s': 1-%d of [A-Za-z0-9._-], not starting with '.'",
                         sp->name ? sp->name : "", ENGINE_ADAPTER_NAME_MAX - 1);
    if (strlen(tenant) >= sizeof r->adapters->tenant)
        return ks_seterr(eb, KS_ERR_INVAL, "tenant name too long");
    float scale = sp->scale == 0.0f ? 1.0f : sp->scale;
    if (!(scale > -100.0f && scale < 100.0f))
        return ks_seterr(eb, KS_ERR_INVAL, "adapter scale %g: must be in (-100, 100)",
                         (double)sp->scale);
    rt_adapter a;
    memset(&a, 0, sizeof a);
    snprintf(a.tenant, sizeof a.tenant, "%s", tenant);
    snprintf(a.name, sizeof a.name, "%s", sp->name);
    a.pub = sp->is_public;
    a.scale = scale;
    a.mi = mi;
    engine_adapter_digest(sp->data, sp->len, scale, a.digest);
    ks_err err = KS_OK;
    pthread_mutex_lock(&r->amu);
    if (r->adapters_sealed)
        err = ks_seterr(eb, KS_ERR_UNSUPPORTED,
                        "add adapters to the workers' --lora and the router's tenants file");
    for (int i = 0; !err && i < r->n_adapters; i++) {
        const rt_adapter *b = &r->adapters[i];
        if (b->mi != mi || strcmp(b->name, a.name)) continue;
        if (!strcmp(b->tenant, a.tenant))
            err = ks_seterr(eb, KS_ERR_INVAL, "this tenant already has an adapter named '%s'",
                            a.name);
        else if (b->pub && a.pub)
            err = ks_seterr(eb, KS_ERR_INVAL, "a public adapter is already named '%s'", a.name);
    }
    if (!err && r->n_adapters >= ENGINE_ADAPTERS_MAX)
        err = ks_seterr(eb, KS_ERR_INVAL, "the adapter limit is reached; not added: '%s'", a.name);
    if (!err && r->n_adapters == r->cap_adapters) {
        int nc = r->cap_adapters ? 2 * r->cap_adapters : 8;
        rt_adapter *na = realloc(r->adapters, (size_t)nc * sizeof *na);
        if (!na) err = ks_seterr(eb, KS_ERR_NOMEM, "adapter");
        else {
            r->adapters = na;
            r->cap_adapters = nc;
        }
    }
    if (!err) r->adapters[r->n_adapters++] = a;
    pthread_mutex_unlock(&r->amu);
    return err;
}

/* server_backend.adapter_remove: tenant's own adapter name of entry mi. */
static ks_err rt__adapter_remove(void *impl, int mi, const char *tenant, const char *name,
                                 ks_errbuf *eb) {
    cluster_router *r = impl;
    tenant = tenant ? tenant : "default";
    bool found = false;
    pthread_mutex_lock(&r->amu);
    for (int i = 0; i < r->n_adapters && !found; i++) {
        rt_adapter *a = &r->adapters[i];
        if (a->mi != mi || strcmp(a->tenant, tenant) || strcmp(a->name, name ? name : ""))
            continue;
        found = true;
        memmove(a, a + 1, (size_t)(r->n_adapters - i - 1) * sizeof *a);
        r->n_adapters--;
    }
    pthread_mutex_unlock(&r->amu);
    if (!found)
        return admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND, "The adapter '%.64s' does not exist",
                            name ? name : "");
    return KS_OK;
}

/* server_backend.adapter_list: entry mi's adapters (tenant non-NULL: those
 * it may use), oldest first. The factors are the workers': rank, n_mats,
 * bytes and running read 0. */
static int rt__adapter_list(void *impl, int mi, const char *tenant, engine_adapter_info *out,
                            int cap) {
    cluster_router *r = impl;
    int n = 0;
    pthread_mutex_lock(&r->amu);
    for (int i = 0; i < r->n_adapters; i++) {
        const rt_adapter *a = &r->adapters[i];
        if (a->mi != mi || (tenant && strcmp(a->tenant, tenant) && !a->pub)) continue;
        if (n < cap) {
            engine_adapter_info *x = &out[n];
            memset(x, 0, sizeof *x);
            snprintf(x->tenant, sizeof x->tenant, "%s", a->tenant);
            snprintf(x->name, sizeof x->name, "%s", a->name);
            x->is_public = a->pub;
            x->scale = a->scale;
            memcpy(x->digest, a->digest, sizeof x->digest);
        }
        n++;
    }
    pthread_mutex_unlock(&r->amu);
    return n;
}

/* The digest of the adapter tenant's request for entry mi names: its own
 * first, then a public one (the whole table is scanned either way). Errors:
 * KS_ERR_INVAL with reason ADMIT_ADAPTER_NOT_FOUND, the engine's words. */
static ks_err rt__adapter_resolve(cluster_router *r, int mi, const char *tenant, const char *name,
                                  uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES], ks_errbuf *eb) {
    int own = -1, pub = -1;
    pthread_mutex_lock(&r->amu);
    for (int i = 0; i < r->n_adapters; i++) {
        const rt_adapter *a = &r->adapters[i];
        bool mine = !strcmp(a->tenant, tenant), named = !strcmp(a->name, name),
             here = a->mi == mi;
        if (here & named & mine && own < 0) own = i;
        else if (here & named & a->pub && pub < 0) pub = i;
    }
    int k = own >= 0 ? own : pub;
    if (k >= 0) memcpy(digest, r->adapters[k].digest, ENGINE_ADAPTER_DIGEST_BYTES);
    pthread_mutex_unlock(&r->amu);
    if (k >= 0) return KS_OK;
    char shown[ENGINE_ADAPTER_NAME_MAX];
    snprintf(shown, sizeof shown, "%s", name);
    return admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND, "The adapter '%s%s' does not exist", shown,
                        strlen(name) >= sizeof shown ? "..." : "");
}

// ----------------------------------------------------------------------------
// Submitting (HTTP threads)

static ks_err rt__submit(void *impl, const engine_params *p, void **out, ks_errbuf *eb) {
    cluster_router *r = impl;
    *out = NULL;
    if (p->model < 0 || p->model >= r->n_models)
        return admit_refuse(eb, ADMIT_INVALID, "no catalog entry %d", (int)p->model);
    rt_model *md = &r->models[p->model];
    if (model_hp(md->m)->encoder) return admit_encoder(model_hp(md->m)->arch_name, eb);
    // the same admission as kvseal serve (I4), against the model's largest decode worker
    admit_limits lim = {.n_ctx = md->n_ctx,
                        .n_vocab = md->V,
                        .page_tokens = (uint32_t)md->g.page_tokens,
                        .max_pages = atomic_load(&md->max_decode_pages),
                        .state_pages = (uint32_t)md->g.state_pages};
    // echo with max_tokens 0: admitted (and run on the workers) as one token, as
    // engine_submit does; nothing generated is shown (rt__on_req_frame)
    engine_params pq = *p;
    const bool prompt_only = p->prompt_logprobs && p->max_tokens == 0;
    if (prompt_only) pq.max_tokens = 1;
    admit_admitted ad = {0};
    ks_err err = KS_OK;
    // the prefill worker sends n_probs alternatives per prompt record
    if (p->prompt_logprobs && p->prompt_top != p->sp.n_probs)
        err = admit_refuse(eb, ADMIT_INVALID,
                           "prompt logprobs: %d alternatives with %d for generated tokens is not "
                           "supported in disaggregated serving",
                           (int)p->prompt_top, (int)p->sp.n_probs);
    else if (p->prompt_top < 0 || p->prompt_top > SAMPLE_MAX_TOP)
        err = admit_refuse(eb, ADMIT_INVALID, "prompt logprobs: %d alternatives (at most %d)",
                           (int)p->prompt_top, SAMPLE_MAX_TOP);
    if (!err) err = admit_request(&lim, &pq, &ad, eb);
    const int32_t *prompt = ad.prompt;
    const int32_t n_prompt = ad.n_prompt, max_tokens = ad.max_tokens;
    pd_msg_sampling ws;
    char why[256];
    ks_errbuf xeb;
    if (!err && sample_bias_validate(p->bias, p->n_bias, md->V, &xeb) != KS_OK)
        err = admit_refuse(eb, ADMIT_INVALID, "%s", xeb.msg);
    // penalties, logit_bias and the grammar travel in ADMIT's and PREFILL's
    // sampling extension: both workers apply them as the local engine does
    size_t glen = 0;
    const char *gtext = p->grammar ? grammar_text(p->grammar, &glen) : NULL;
    uint8_t *bias = NULL;
    if (!err && p->n_bias > 0 && !(bias = malloc(8u * (size_t)p->n_bias)))
        err = ks_seterr(eb, KS_ERR_NOMEM, "request");
    for (int i = 0; !err && i < p->n_bias; i++)
        pd_msg_bias_store(bias, (uint32_t)i, p->bias[i].token, p->bias[i].bias);
    if (!err &&
        !cl_sampling_to_msg(&p->sp, max_tokens, p->ignore_eos, gtext, (uint32_t)glen, bias,
                            (uint32_t)(p->n_bias > 0 ? p->n_bias : 0), &ws, why, sizeof why))
        err = admit_refuse(eb, ADMIT_INVALID, "%s", why);
    if (!err && p->prompt_logprobs) ws.flags |= PD_FLAG_PROMPT_LP;
    // the adapter: resolved under the authenticated tenant, carried as its
    // digest in ADMIT and PREFILL (PD_FLAG_ADAPTER)
    if (!err && p->adapter && *p->adapter)
        err = rt__adapter_resolve(r, p->model, p->tenant ? p->tenant : "default", p->adapter,
                                  ws.adapter, eb);
    if (!err && (!atomic_load(&r->online) || !atomic_load(&md->online)))
        err = admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (!err && (!atomic_load(&md->n_decode) || !atomic_load(&md->n_prefill)))
        err = admit_refuse(eb, ADMIT_NO_WORKER,
                           "no %s worker is registered with the router for model '%s'",
                           !atomic_load(&md->n_prefill) ? "prefill" : "decode", md->name);
    if (!err && atomic_load(&r->n_waiting) >= r->o.queue_max)
        err = admit_refuse(eb, ADMIT_BUSY, "the server is busy: %u requests already waiting",
                           r->o.queue_max);
    if (err) {
        free(bias);
        atomic_fetch_add(&r->n_rejected, 1);
        atomic_fetch_add(&md->n_rejected, 1);
        return err;
    }
    atomic_fetch_add(&md->n_admitted, 1);
    rt_req *q = calloc(1, sizeof *q);
    if (!q) {
        free(bias);
        return ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    q->bias = bias; // ws points into these two
    q->g = p->grammar ? grammar_ref(p->grammar) : NULL;
    atomic_init(&q->refs, 2);
    atomic_init(&q->state, ENGINE_QUEUED);
    q->r = r;
    q->mi = p->model;
    q->id = atomic_fetch_add(&r->next_req_id, 1);
    snprintf(q->tenant, sizeof q->tenant, "%s", p->tenant ? p->tenant : "default");
    engine_domain_root(p, q->domain);
    q->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    q->n_prompt = n_prompt;
    q->max_tokens = max_tokens;
    q->sp = p->sp;
    q->ws = ws;
    q->echo_lp = p->prompt_logprobs;
    q->prompt_only = prompt_only;
    q->lp_top = (uint32_t)(p->prompt_top < md->V ? p->prompt_top : md->V);
    q->t_submit_ns = ks_now_ns();
    ks_err ce = KS_OK;
    if (q->prompt) memcpy(q->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (q->prompt) { // the prefill worker's cache key: the domain, with the adapter mixed in
        uint8_t key[32];
        memcpy(key, q->domain, sizeof key);
        static const uint8_t none[PD_MSG_ADAPTER_BYTES];
        if (memcmp(ws.adapter, none, sizeof none)) engine_root_with_adapter(key, ws.adapter);
        rt__affinity(key, q->prompt, n_prompt, md->g.page_tokens, q->affinity);
    }
    if (!q->prompt || (ce = engine_stream_create(p->stops, p->n_stops, &q->out, eb))) {
        rt__req_free(q);
        return ce ? ce : ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    engine_stream_set_min_tokens(q->out, p->sp.min_tokens);
    atomic_fetch_add(&r->n_waiting, 1);  // until the loop takes it (rt__on_submit)
    atomic_fetch_add(&r->tokens_in, (unsigned long long)n_prompt);
    if (pd_loop_post(r->loop, rt__on_submit, q) != KS_OK) {
        atomic_fetch_sub(&r->n_waiting, 1);
        rt__req_free(q);
        return ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    atomic_fetch_sub(&r->n_waiting, 1);  // rt__on_submit counts it again in the queue
    *out = q;
    return KS_OK;
}

/* server_backend.embed_submit: admit_embed as engine_embed_submit (I4),
 * then the loop sends it to a prefill worker (rt__embed_start). */
static ks_err rt__embed_submit(void *impl, const engine_embed_params *p, void **out,
                               ks_errbuf *eb) {
    cluster_router *r = impl;
    *out = NULL;
    if (p->model < 0 || p->model >= r->n_models)
        return admit_refuse(eb, ADMIT_INVALID, "no catalog entry %d", (int)p->model);
    rt_model *md = &r->models[p->model];
    admit_limits lim = {
        .n_ctx = md->n_ctx, .n_vocab = md->V, .page_tokens = (uint32_t)md->g.page_tokens};
    ks_err err = admit_embed(&lim, p->tokens, p->n_tokens, eb);
    model_pooling pool = p->pooling ? p->pooling : r->o.pooling;
    if (!err && pool && !model_pooling_name(pool))
        err =
            admit_refuse(eb, ADMIT_INVALID, "pooling %d is not supported (mean, cls, last)", (int)pool);
    if (!err && (!atomic_load(&r->online) || !atomic_load(&md->online)))
        err = admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (!err && !atomic_load(&md->n_prefill))
        err = admit_refuse(eb, ADMIT_NO_WORKER,
                           "no prefill worker is registered with the router for model '%s'",
                           md->name);
    if (!err && atomic_load(&r->n_waiting) >= r->o.queue_max)
        err = admit_refuse(eb, ADMIT_BUSY, "the server is busy: %u requests already waiting",
                           r->o.queue_max);
    if (err) {
        atomic_fetch_add(&r->n_rejected, 1);
        atomic_fetch_add(&md->n_rejected, 1);
        return err;
    }
    atomic_fetch_add(&md->n_admitted, 1);
    rt_req *q = calloc(1, sizeof *q);
    if (!q) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    atomic_init(&q->refs, 2);
    atomic_init(&q->state, ENGINE_QUEUED);
    q->r = r;
    q->mi = p->model;
    q->id = atomic_fetch_add(&r->next_req_id, 1);
    q->embed = true;
    q->pooling = (uint32_t)pool;
    snprintf(q->tenant, sizeof q->tenant, "%s", p->tenant ? p->tenant : "default");
    engine_params dp = {.tenant = p->tenant};
    engine_domain_root(&dp, q->domain);
    q->prompt = malloc(sizeof(int32_t) * (size_t)p->n_tokens);
    q->evec = malloc(sizeof(float) * (size_t)model_hp(md->m)->n_embd);
    q->n_prompt = p->n_tokens;
    q->t_submit_ns = ks_now_ns();
    ks_err ce = KS_OK;
    if (!q->prompt || !q->evec || (ce = engine_stream_create(NULL, 0, &q->out, eb))) {
        rt__req_free(q);
        return ce ? ce : ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    memcpy(q->prompt, p->tokens, sizeof(int32_t) * (size_t)p->n_tokens);
    atomic_fetch_add(&r->n_waiting, 1); // until the loop takes it (rt__on_submit)
    atomic_fetch_add(&r->tokens_in, (unsigned long long)p->n_tokens);
    if (pd_loop_post(r->loop, rt__on_submit, q) != KS_OK) {
        atomic_fetch_sub(&r->n_waiting, 1);
        rt__req_free(q);
        return ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    atomic_fetch_sub(&r->n_waiting, 1); // rt__on_submit counts it again in the queue
    *out = q;
    return KS_OK;
}

/* server_backend.embed_vector: the vector once the done event (FINISHED)
 * was taken. */
static ks_err rt__embed_vector(void *req, float *out, int32_t cap) {
    rt_req *q = req;
    int32_t E = model_hp(q->r->models[q->mi].m)->n_embd;
    if (!q->embed || cap < E || atomic_load(&q->state) != ENGINE_FINISHED ||
        !engine_stream_done_posted(q->out))
        return KS_ERR_INVAL;
    memcpy(out, q->evec, sizeof(float) * (size_t)E);
    return KS_OK;
}

static void rt__cancel(void *req) {
    rt_req *q = req;
    if (atomic_exchange(&q->cancelled, true)) return;
    atomic_fetch_add(&q->refs, 1);
    if (pd_loop_post(q->r->loop, rt__on_cancel, q) != KS_OK) rt__unref(q);
}

static void rt__release(void *req) {
    rt_req *q = req;
    if (!q) return;
    if (!engine_stream_done_posted(q->out)) rt__cancel(q);
    rt__unref(q);
}

/* n choices (OpenAI's n / best_of): n independent cluster requests, choice
 * i with seed + i, so each equals an n=1 request with that seed (as
 * engine_submit_n's choices do). They do not share pages across workers;
 * a prefill worker's prefix cache may still serve the repeated prompt. On
 * error no handle is left. */
static ks_err rt__submit_n(void *impl, const engine_params *p, int n, void **out, ks_errbuf *eb) {
    if (n < 1 || n > ENGINE_MAX_N)
        return admit_refuse(eb, ADMIT_INVALID, "n must be in [1, %d], got %d", ENGINE_MAX_N, n);
    if (p->prompt_logprobs && p->max_tokens == 0 && n > 1)
        return admit_refuse(eb, ADMIT_INVALID, "max_tokens 0 allows one choice only, got n=%d", n);
    engine_params pi = *p;
    for (int i = 0; i < n; i++) {
        pi.sp.seed = p->sp.seed + (uint64_t)i;
        pi.prompt_logprobs = i == 0 && p->prompt_logprobs; // the prompt's, once (as the engine)
        ks_err e = rt__submit(impl, &pi, &out[i], eb);
        if (e != KS_OK) {
            while (i-- > 0) {
                rt__release(out[i]);
                out[i] = NULL;
            }
            return e;
        }
    }
    return KS_OK;
}

static bool rt__is_online(void *impl) { return atomic_load(&((cluster_router *)impl)->online); }

/* What an abort posted to the loop covers: every model (mi < 0) or one. */
typedef struct rt_abort_job {
    cluster_router *r;
    int mi;
} rt_abort_job;

static void rt__on_abort_all(void *arg) {
    rt_abort_job *j = arg;
    cluster_router *r = j->r;
    for (int b = 0; b < RT_BUCKETS; b++)
        for (rt_req *q = r->tab[b], *nx; q; q = nx) {
            nx = q->hnext;
            if (j->mi < 0 || q->mi == j->mi)
                rt__abort(r, q, PD_ABORT_SHUTDOWN, KS_ERR_CANCELLED, "aborted: model taken offline");
        }
    free(j);
}

static void rt__post_abort(cluster_router *r, int mi) {
    rt_abort_job *j = malloc(sizeof *j);
    if (j) *j = (rt_abort_job){.r = r, .mi = mi};
    if (!j || pd_loop_post(r->loop, rt__on_abort_all, j) != KS_OK) {
        free(j);
        ks_log(KS_LOG_ERROR, "router: out of memory aborting requests");
    }
}

static void rt__set_online(void *impl, bool online, bool abort_running) {
    cluster_router *r = impl;
    atomic_store(&r->online, online);
    if (!online && abort_running) rt__post_abort(r, -1);
}

/* server_backend.set_model_online: one catalog entry offline/online. */
static void rt__set_model_online(void *impl, int mi, bool online, bool abort_running) {
    cluster_router *r = impl;
    if (mi < 0 || mi >= r->n_models) return;
    atomic_store(&r->models[mi].online, online);
    ks_log(KS_LOG_INFO, "router: model '%s' %s", r->models[mi].name,
           online ? "online" : "offline");
    if (!online && abort_running) rt__post_abort(r, mi);
}

static bool rt__is_model_online(void *impl, int mi) {
    cluster_router *r = impl;
    return mi >= 0 && mi < r->n_models && atomic_load(&r->models[mi].online);
}

/* Appends a label value with \\, \" and \n escaped (Prometheus text format). */
static void rt__lbl(char *b, size_t cap, size_t *n, const char *v) {
    for (; *v && *n + 3 < cap; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n') b[(*n)++] = '\\';
        b[(*n)++] = *v == '\n' ? 'n' : *v;
    }
    b[*n] = 0;
}

/* server_backend.metrics_text: the catalog's per-model series. */
static char *rt__metrics_text(void *impl) {
    cluster_router *r = impl;
    size_t cap = 2048 + (size_t)r->n_models * 1536, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    static const char *const head =
        "# HELP kvseal_model_workers Workers registered for each model of the router's catalog.\n"
        "# TYPE kvseal_model_workers gauge\n";
    n = (size_t)snprintf(b, cap, "%s", head);
    const char *what[5] = {"workers", "online", "admitted", "rejected", "replaced"};
    for (int k = 0; k < 5; k++) {
        if (k == 1)
            n += (size_t)snprintf(b + n, cap - n,
                                  "# HELP kvseal_model_online Whether the model takes new requests "
                                  "(/admin/models/{name}/offline).\n# TYPE kvseal_model_online gauge\n");
        else if (k == 2)
            n += (size_t)snprintf(b + n, cap - n,
                                  "# HELP kvseal_model_admitted_total Requests for the model past "
                                  "admission.\n# TYPE kvseal_model_admitted_total counter\n");
        else if (k == 3)
            n += (size_t)snprintf(b + n, cap - n,
                                  "# HELP kvseal_model_rejected_total Requests for the model refused "
                                  "at admission (no worker, offline, too long, ...).\n"
                                  "# TYPE kvseal_model_rejected_total counter\n");
        else if (k == 4)
            n += (size_t)snprintf(b + n, cap - n,
                                  "# HELP kvseal_model_replaced_total Requests for the model started "
                                  "over on another prefill worker: their prefill worker or its data "
                                  "link to decode was lost before the first token.\n"
                                  "# TYPE kvseal_model_replaced_total counter\n");
        for (int i = 0; i < r->n_models && n + 256 < cap; i++) {
            const rt_model *md = &r->models[i];
            for (int role = 0; role < (k == 0 ? 2 : 1); role++) {
                n += (size_t)snprintf(b + n, cap - n, "kvseal_model_%s%s{model=\"", what[k],
                                      k >= 2 ? "_total" : "");
                rt__lbl(b, cap - 64, &n, md->name);
                if (k == 0)
                    n += (size_t)snprintf(b + n, cap - n, "\",role=\"%s\"} %u\n",
                                          role ? "prefill" : "decode",
                                          atomic_load(role ? &md->n_prefill : &md->n_decode));
                else if (k == 1)
                    n += (size_t)snprintf(b + n, cap - n, "\"} %d\n", atomic_load(&md->online) ? 1 : 0);
                else
                    n += (size_t)snprintf(b + n, cap - n, "\"} %llu\n",
                                          (unsigned long long)atomic_load(
                                              k == 2   ? &md->n_admitted
                                              : k == 3 ? &md->n_rejected
                                                       : &md->n_replaced));
            }
        }
    }
    return b;
}

static void rt__get_stats(void *impl, engine_stats *out) {
    cluster_router *r = impl;
    memset(out, 0, sizeof *out);
    uint32_t fr = atomic_load(&r->kv_free), qu = atomic_load(&r->kv_quarantined),
             tot = atomic_load(&r->kv_total);
    out->kv.pages[KV_PAGE_FREE] = fr;
    out->kv.pages[KV_PAGE_QUARANTINE] = qu;
    out->kv.pages[KV_PAGE_ALLOCATED] = tot > fr + qu ? tot - fr - qu : 0;
    out->n_queued = atomic_load(&r->n_waiting);
    out->n_running = atomic_load(&r->n_inflight);
    out->n_finished = atomic_load(&r->n_finished);
    out->n_aborted = atomic_load(&r->n_aborted);
    out->n_rejected = atomic_load(&r->n_rejected);
    out->tokens_in = atomic_load(&r->tokens_in);
    out->tokens_out = atomic_load(&r->tokens_out);
}

/* Waits until nothing is in flight anywhere (router and workers), then
 * reports whether every worker's pool is all FREE and scrubbed. */
static ks_err rt__check_quiescent(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    cluster_router *r = impl;
    uint64_t deadline = cl_now_ms(NULL) + timeout_ms;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        r->check_state = 1;
        r->check_req++;
        while (r->check_state != 2) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            if (cl_now_ms(NULL) > deadline + 3000) break;
        }
        bool answered = r->check_state == 2, clean = r->check_clean, busy = r->check_busy;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", r->check_msg);
        r->check_state = 0;
        pthread_mutex_unlock(&r->mu);
        if (answered && !busy)
            return clean ? (ks_seterr(eb, KS_OK, "%s", msg), KS_OK)
                         : ks_seterr(eb, KS_ERR_INTERNAL, "%s", msg);
        if (cl_now_ms(NULL) >= deadline)
            return ks_seterr(eb, KS_ERR_TIMEOUT, "requests still active: %s", answered ? msg : "no answer");
        struct timespec nap = {0, 50 * 1000000L};
        nanosleep(&nap, NULL);
    }
}

void cluster_router_backend(cluster_router *r, server_backend *out) {
    *out = (server_backend){.impl = r,
                            .submit = rt__submit,
                            .next = rt__next,
                            .cancel = rt__cancel,
                            .release = rt__release,
                            .set_notify = rt__set_notify,
                            .is_online = rt__is_online,
                            .set_online = rt__set_online,
                            .set_model_online = rt__set_model_online,
                            .is_model_online = rt__is_model_online,
                            .metrics_text = rt__metrics_text,
                            .get_stats = rt__get_stats,
                            .check_quiescent = rt__check_quiescent,
                            .submit_n = rt__submit_n,
                            .embed_submit = rt__embed_submit,
                            .embed_vector = rt__embed_vector,
                            .adapter_add = rt__adapter_add,
                            .adapter_remove = rt__adapter_remove,
                            .adapter_list = rt__adapter_list};
}
