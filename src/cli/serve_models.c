/* serve_models.c — `kvseal serve` with several models: -m repeated and/or
 * --models-dir DIR (every *.gguf there a model, named by its file), with
 * aliases and per-model settings from a small JSON file (--models-config,
 * default DIR/models.json; docs/models.md "Several models in one server").
 *
 * Each model gets an engine of its own (its own KV pool, context and
 * scheduler thread), created when a request first names the model and
 * destroyed again, least recently used first, when another model must load
 * and the loaded ones would exceed --models-memory (or --models-max-loaded).
 * A model's memory is estimated as its file (the repacked weights) plus its
 * KV pool; the estimate is what the budget counts.
 *
 * At start every model's tokenizer, template and shape are read (the file
 * mapped, no weight repacked: model_load_unpacked) so that the HTTP front
 * can tokenize and admit any model's requests, and every model's pool is
 * checked against its context (I8) exactly as a one-model serve checks its
 * own: a model that could not serve one full-context request refuses the
 * start. A request for a model that is not loaded is answered 503
 * model_loading (with Retry-After) and queues the load on the loader
 * thread; a model whose load failed is answered 503 with the load's error
 * for a few seconds, then loading is tried again.
 *
 * The backend here (server_backend) wraps each engine request with the
 * slot it runs on: a slot with requests (or a pin: a stats or check call)
 * is never unloaded, so an engine is destroyed only when nothing can reach
 * it. Unloading destroys the engine (its pool's pages are released and
 * scrubbed, I3; a page still held is scrubbed by kv_pool_destroy) and frees
 * the repacked weights. */
#include "cli_int.h"

#include "kvseal/admit.h"
#include "kvseal/engine.h"
#include "kvseal/kern.h"
#include "kvseal/kv.h"
#include "kvseal/server.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

enum { MS_UNLOADED, MS_LOADING, MS_LOADED, MS_UNLOADING };

/* A LoRA adapter of a model (server_backend.adapter_add): its file is kept
 * so that each load of the model loads it again (scrubbed when removed). */
typedef struct ms_adapter {
    char tenant[128], name[ENGINE_ADAPTER_NAME_MAX];
    bool is_public;
    float scale;
    uint8_t *data;
    size_t len;
    struct ms_adapter *next;
} ms_adapter;
static const char *const ms__state_name[] = {"unloaded", "loading", "loaded", "unloading"};

#define MS_RETRY_FAILED_NS (5ull * 1000000000ull) /* a failed load is retried after 5 s */

typedef struct ms_slot {
    int index;                /* catalog entry (engine_params.model) */
    char name[256];           /* the file's basename without .gguf */
    char label[520];          /* name as a Prometheus label value (\\, \" and \n escaped) */
    char *path;               /* owned */
    char *alias_buf[SERVE_MAX_ALIASES]; /* owned copies */
    const char *aliases[SERVE_MAX_ALIASES];
    int n_aliases;
    bool preload;             /* models.json "preload": queued for loading at start */
    long ctx, kv_pages;       /* models.json overrides (0: the command line's) */
    uint64_t kv_memory;
    model *hm;                /* tokenizer, template, shape (unpacked): the server's, always */
    engine_opts o;            /* sized at start; o.m is set at each load */
    uint64_t file_bytes, kv_bytes; /* the budget's estimate: weights + pool */
    struct stat st0;          /* the file at start: a load refuses another file at its path */
    /* the rest under ms_set.mu */
    int state;
    bool want;         /* a request asked for it: the loader loads it */
    bool drop;         /* /admin/models/{id}/unload: the loader unloads it once idle */
    uint64_t want_ns;  /* when it was first asked for (the loader takes the oldest) */
    model *m;          /* loaded: the repacked model */
    engine *e;
    server_backend eb; /* e's backend */
    int active;        /* request handles and pins on e: never unloaded while > 0 */
    uint64_t last_used_ns;
    bool online;       /* /admin/models/{id}/offline */
    uint64_t loads, unloads, failures;
    double load_s;     /* the last load's seconds */
    char err[KS_ERRMSG_CAP]; /* the last failed load's message */
    uint64_t err_ns;   /* when it failed (0: the last load did not fail) */
    engine_stats retired; /* the counters of its engines already unloaded */
    /* its LoRA adapters, oldest first, loaded into e at each load. Changed
     * with amu and mu held (amu first), read with either: amu serializes the
     * slow part (an adapter loaded into e, mu released) against the loader's
     * replay, so other models' admission never waits on it. */
    ms_adapter *adapters;
    pthread_mutex_t amu;
} ms_slot;

typedef struct ms_set {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the loader's: a load asked for, a handle released, stop */
    ms_slot *slots;
    int n;
    uint64_t budget, used; /* bytes: --models-memory; the loaded (and loading) estimates */
    int max_loaded, n_loaded;
    bool online, stop;
    pthread_t loader;
    bool loader_on;
} ms_set;

/* A request handle of the backend: the engine's, and the slot it pins. */
typedef struct ms_req {
    ms_set *set;
    ms_slot *slot;
    void *inner;
} ms_req;

static uint64_t ms__bytes(const ms_slot *sl) { return sl->file_bytes + sl->kv_bytes; }

// ----------------------------------------------------------------------------
// Loading and unloading (the loader thread)

/* Loads sl's weights and creates its engine (mu not held; sl is LOADING). */
static ks_err ms__load(ms_slot *sl, ks_errbuf *eb) {
    model *m = NULL;
    engine *e = NULL;
    ks_err err = model_load(sl->path, &m, eb);
    if (!err) err = model_kv_type_check(m, sl->o.kv_type, eb);
    if (!err) {
        engine_opts o = sl->o;
        o.m = m;
        o.sizing_logged = true; // said once, at start
        err = engine_create(&o, &e, eb);
    }
    if (err) {
        model_free(m);
        return err;
    }
    sl->m = m;
    sl->e = e;
    server_engine_backend(e, &sl->eb);
    return KS_OK;
}

/* Adds the counters of st (not its gauges) to acc. */
static void ms__stats_add_counters(engine_stats *acc, const engine_stats *st) {
    acc->n_finished += st->n_finished;
    acc->n_aborted += st->n_aborted;
    acc->n_rejected += st->n_rejected;
    acc->tokens_in += st->tokens_in;
    acc->tokens_out += st->tokens_out;
    acc->n_violations += st->n_violations;
    acc->spec_steps += st->spec_steps;
    acc->spec_drafted += st->spec_drafted;
    acc->spec_accepted += st->spec_accepted;
    acc->adapter_requests += st->adapter_requests;
    acc->kv.violations += st->kv.violations;
    acc->kv.prefix_hits_pages += st->kv.prefix_hits_pages;
    acc->kv.allocations += st->kv.allocations;
}

/* Destroys sl's engine and weights (mu not held; sl is UNLOADING, with no
 * handle, or the loader is stopped). Its pool's pages are released and
 * scrubbed on the way (I3); its counters are kept in sl->retired. */
static void ms__unload(ms_set *s, ms_slot *sl) {
    engine_stats st;
    engine_get_stats(sl->e, &st);
    engine_destroy(sl->e);
    model_free(sl->m);
    pthread_mutex_lock(&s->mu);
    ms__stats_add_counters(&sl->retired, &st);
    sl->e = NULL;
    sl->m = NULL;
    memset(&sl->eb, 0, sizeof sl->eb);
    pthread_mutex_unlock(&s->mu);
}

/* The least recently used loaded slot without handles, other than keep;
 * NULL when none. mu held. */
static ms_slot *ms__victim(ms_set *s, const ms_slot *keep) {
    ms_slot *v = NULL;
    for (int i = 0; i < s->n; i++) {
        ms_slot *sl = &s->slots[i];
        if (sl == keep || sl->state != MS_LOADED || sl->active > 0) continue;
        if (!v || sl->last_used_ns < v->last_used_ns) v = sl;
    }
    return v;
}

/* Whether sl fits beside the loaded models. mu held. */
static bool ms__fits(const ms_set *s, const ms_slot *sl) {
    return s->used + ms__bytes(sl) <= s->budget && (!s->max_loaded || s->n_loaded < s->max_loaded);
}

/* Whether sl's path now names another file than at start (replaced,
 * rewritten, gone): its tokenizer, read at start, would not be the
 * weights'. The reason goes to why. */
static bool ms__changed(const ms_slot *sl, char *why, size_t cap) {
    struct stat st;
    if (stat(sl->path, &st) != 0) {
        snprintf(why, cap, "%s: %s", sl->path, strerror(errno));
        return true;
    }
    if (st.st_dev != sl->st0.st_dev || st.st_ino != sl->st0.st_ino ||
        st.st_size != sl->st0.st_size || st.st_mtim.tv_sec != sl->st0.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != sl->st0.st_mtim.tv_nsec) {
        snprintf(why, cap, "%s changed on disk since the start (restart kvseal to serve the new "
                 "file)", sl->path);
        return true;
    }
    return false;
}

/* Records a failed load of sl (mu held): answered with why for a while,
 * then tried again on the next request. */
static void ms__failed(ms_set *s, ms_slot *sl, const char *why) {
    (void)s;
    sl->want = false;
    sl->failures++;
    sl->err_ns = ks_now_ns();
    snprintf(sl->err, sizeof sl->err, "%s", why);
    ks_log(KS_LOG_ERROR, "model %s: load failed: %s", sl->name, sl->err);
}

/* Loads sl's adapters into its new engine (amu held, sl LOADING). */
static void ms__adapters_replay(ms_slot *sl) {
    for (ms_adapter *a = sl->adapters; a; a = a->next) { // checked when added
        engine_adapter_spec sp = {.tenant = a->tenant, .name = a->name, .is_public = a->is_public,
                                  .scale = a->scale, .data = a->data, .len = a->len};
        ks_errbuf aeb = {0};
        if (engine_adapter_add(sl->e, &sp, &aeb))
            ks_log(KS_LOG_ERROR, "model %s: a LoRA adapter did not load again: %s", sl->name,
                   aeb.msg);
    }
}

/* The loader thread: takes the longest-waiting wanted slot, unloads the
 * least recently used idle models until it fits, loads it. A model that
 * cannot fit yet (the others are busy) waits for a handle's release. */
static void *ms__loader(void *arg) {
    ms_set *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        for (int i = 0; i < s->n; i++) { // the admin's unloads first
            ms_slot *v = &s->slots[i];
            if (!v->drop) continue;
            v->drop = false;
            if (v->state != MS_LOADED || v->active > 0) continue; // busy again: it stays
            v->state = MS_UNLOADING;
            pthread_mutex_unlock(&s->mu);
            ks_log(KS_LOG_INFO, "model %s: unloading (asked by the admin)", v->name);
            ms__unload(s, v);
            pthread_mutex_lock(&s->mu);
            v->state = MS_UNLOADED;
            v->unloads++;
            s->n_loaded--;
            s->used -= ms__bytes(v);
            pthread_cond_broadcast(&s->cv);
        }
        ms_slot *sl = NULL;
        for (int i = 0; i < s->n; i++)
            if (s->slots[i].want && s->slots[i].state == MS_UNLOADED &&
                (!sl || s->slots[i].want_ns < sl->want_ns))
                sl = &s->slots[i];
        if (!sl) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        char why[KS_ERRMSG_CAP];
        if (ms__changed(sl, why, sizeof why)) { // before anything is unloaded for it
            ms__failed(s, sl, why);
            continue;
        }
        while (!ms__fits(s, sl)) {
            ms_slot *v = ms__victim(s, sl);
            if (!v) break;
            v->state = MS_UNLOADING;
            pthread_mutex_unlock(&s->mu);
            ks_log(KS_LOG_INFO, "model %s: unloading (least recently used) to make room for %s",
                   v->name, sl->name);
            ms__unload(s, v);
            pthread_mutex_lock(&s->mu);
            v->state = MS_UNLOADED;
            v->unloads++;
            s->n_loaded--;
            s->used -= ms__bytes(v);
        }
        if (!ms__fits(s, sl)) { // every loaded model is busy: wait for one to go idle
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            continue;
        }
        sl->state = MS_LOADING;
        s->used += ms__bytes(sl);
        s->n_loaded++;
        pthread_mutex_unlock(&s->mu);
        ks_log(KS_LOG_INFO, "model %s: loading %s (%.0f MB of weights, %.0f MB of KV pool)",
               sl->name, sl->path, (double)sl->file_bytes / 1e6, (double)sl->kv_bytes / 1e6);
        ks_errbuf eb = {0};
        uint64_t t0 = ks_now_ns();
        ks_err err = ms__load(sl, &eb);
        double secs = (double)(ks_now_ns() - t0) * 1e-9;
        // its adapters, into the new engine before anyone sees it loaded;
        // amu held until it is (an adapter added meanwhile waits, then finds
        // it loaded and adds itself)
        pthread_mutex_lock(&sl->amu);
        if (!err) ms__adapters_replay(sl);
        pthread_mutex_lock(&s->mu);
        pthread_mutex_unlock(&sl->amu); // mu held: the state below is set before anyone looks
        if (err) {
            sl->state = MS_UNLOADED;
            s->used -= ms__bytes(sl);
            s->n_loaded--;
            ms__failed(s, sl, eb.msg[0] ? eb.msg : ks_strerror(err));
        } else {
            sl->want = false;
            sl->state = MS_LOADED;
            sl->load_s = secs;
            sl->loads++;
            sl->err_ns = 0;
            sl->last_used_ns = ks_now_ns();
            if (!s->online || !sl->online) sl->eb.set_online(sl->eb.impl, false, false);
            ks_log(KS_LOG_INFO, "model %s: loaded in %.2f s (%d of %d models loaded, %.0f of %.0f MB)",
                   sl->name, sl->load_s, s->n_loaded, s->n, (double)s->used / 1e6,
                   (double)s->budget / 1e6);
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ----------------------------------------------------------------------------
// The backend

/* Takes a handle on sl's engine for a new request, or refuses: offline,
 * loading (queues the load), or the last load failed. mu held. */
static ks_err ms__pin_for_request(ms_set *s, ms_slot *sl, ks_errbuf *eb) {
    if (!s->online) return admit_refuse(eb, ADMIT_OFFLINE, "the server is offline");
    if (!sl->online) return admit_refuse(eb, ADMIT_OFFLINE, "the model '%s' is offline", sl->name);
    uint64_t now = ks_now_ns();
    if (sl->state == MS_LOADED) {
        sl->active++;
        sl->last_used_ns = now;
        return KS_OK;
    }
    if (sl->state == MS_UNLOADED && sl->err_ns && now - sl->err_ns < MS_RETRY_FAILED_NS)
        return admit_refuse(eb, ADMIT_MODEL_LOADING,
                            "the model '%s' failed to load (%s); loading is retried shortly",
                            sl->name, sl->err);
    if (!sl->want) {
        sl->want = true;
        sl->want_ns = now;
        pthread_cond_broadcast(&s->cv);
    }
    return admit_refuse(eb, ADMIT_MODEL_LOADING,
                        "the model '%s' is loading (%.0f MB); retry in a moment", sl->name,
                        (double)ms__bytes(sl) / 1e6);
}

/* Drops n handles on sl; wakes the loader (it may wait for an idle model). */
static void ms__unpin(ms_set *s, ms_slot *sl, int n) {
    pthread_mutex_lock(&s->mu);
    sl->active -= n;
    KS_ASSERT(sl->active >= 0);
    sl->last_used_ns = ks_now_ns();
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* The slot of catalog entry k, or NULL (refused with eb). */
static ms_slot *ms__slot(ms_set *s, int32_t k, ks_errbuf *eb) {
    if (k < 0 || k >= s->n) {
        admit_refuse(eb, ADMIT_INVALID, "no model %d in the catalog", (int)k);
        return NULL;
    }
    return &s->slots[k];
}

static ks_err ms__wrap(ms_set *s, ms_slot *sl, void *inner, void **out, ks_errbuf *eb) {
    ms_req *r = malloc(sizeof *r);
    if (!r) {
        sl->eb.release(inner);
        ms__unpin(s, sl, 1);
        return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    }
    *r = (ms_req){s, sl, inner};
    *out = r;
    return KS_OK;
}

/* Catalog entry k's slot in *out with a handle taken for a request
 * (ms__pin_for_request), or its refusal. */
static ks_err ms__pin_entry(ms_set *s, int32_t k, ms_slot **out, ks_errbuf *eb) {
    *out = ms__slot(s, k, eb);
    if (!*out) return KS_ERR_INVAL;
    pthread_mutex_lock(&s->mu);
    ks_err err = ms__pin_for_request(s, *out, eb);
    pthread_mutex_unlock(&s->mu);
    return err;
}

static ks_err ms__submit(void *impl, const engine_params *p, void **out, ks_errbuf *eb) {
    ms_set *s = impl;
    *out = NULL;
    ms_slot *sl;
    ks_err err = ms__pin_entry(s, p->model, &sl, eb);
    if (err) return err;
    engine_params q = *p;
    q.model = 0; // the slot's engine serves one model
    void *inner = NULL;
    if ((err = sl->eb.submit(sl->eb.impl, &q, &inner, eb))) {
        ms__unpin(s, sl, 1);
        return err;
    }
    return ms__wrap(s, sl, inner, out, eb);
}

static ks_err ms__submit_n(void *impl, const engine_params *p, int n, void **reqs, ks_errbuf *eb) {
    ms_set *s = impl;
    ms_slot *sl = ms__slot(s, p->model, eb);
    if (!sl) return KS_ERR_INVAL;
    if (n < 1) return ks_seterr(eb, KS_ERR_INVAL, "n must be at least 1");
    ms_req **rs = calloc((size_t)n, sizeof *rs);
    void **inner = calloc((size_t)n, sizeof *inner);
    if (!rs || !inner) {
        free(rs);
        free(inner);
        return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        if (!(rs[i] = malloc(sizeof *rs[i]))) {
            for (int j = 0; j < i; j++) free(rs[j]);
            free(rs);
            free(inner);
            return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
        }
    pthread_mutex_lock(&s->mu);
    ks_err err = ms__pin_for_request(s, sl, eb);
    if (!err) sl->active += n - 1; // one handle per choice
    pthread_mutex_unlock(&s->mu);
    if (!err) {
        engine_params q = *p;
        q.model = 0;
        if ((err = sl->eb.submit_n(sl->eb.impl, &q, n, inner, eb))) ms__unpin(s, sl, n);
    }
    for (int i = 0; i < n; i++) {
        if (err) {
            free(rs[i]);
            continue;
        }
        *rs[i] = (ms_req){s, sl, inner[i]};
        reqs[i] = rs[i];
    }
    free(rs);
    free(inner);
    return err;
}

static ks_err ms__embed_submit(void *impl, const engine_embed_params *p, void **out, ks_errbuf *eb) {
    ms_set *s = impl;
    *out = NULL;
    ms_slot *sl;
    ks_err err = ms__pin_entry(s, p->model, &sl, eb);
    if (err) return err;
    engine_embed_params q = *p;
    q.model = 0;
    void *inner = NULL;
    if ((err = sl->eb.embed_submit(sl->eb.impl, &q, &inner, eb))) {
        ms__unpin(s, sl, 1);
        return err;
    }
    return ms__wrap(s, sl, inner, out, eb);
}

static ks_err ms__next(void *req, engine_event *ev, uint32_t timeout_ms) {
    ms_req *r = req;
    return r->slot->eb.next(r->inner, ev, timeout_ms);
}
static void ms__cancel(void *req) {
    ms_req *r = req;
    r->slot->eb.cancel(r->inner);
}
static void ms__release(void *req) {
    ms_req *r = req;
    if (!r) return;
    r->slot->eb.release(r->inner);
    ms__unpin(r->set, r->slot, 1);
    free(r);
}
static void ms__set_notify(void *req, void (*notify)(void *ctx), void *ctx) {
    ms_req *r = req;
    r->slot->eb.set_notify(r->inner, notify, ctx);
}
static ks_err ms__embed_vector(void *req, float *out, int32_t cap) {
    ms_req *r = req;
    return r->slot->eb.embed_vector(r->inner, out, cap);
}

static bool ms__is_online(void *impl) {
    ms_set *s = impl;
    pthread_mutex_lock(&s->mu);
    bool on = s->online;
    pthread_mutex_unlock(&s->mu);
    return on;
}

/* Every loaded engine online or offline (aborting what runs when asked);
 * models loaded later follow. */
static void ms__set_online(void *impl, bool online, bool abort_running) {
    ms_set *s = impl;
    pthread_mutex_lock(&s->mu);
    s->online = online;
    for (int i = 0; i < s->n; i++) {
        ms_slot *sl = &s->slots[i];
        if (sl->state == MS_LOADED) sl->eb.set_online(sl->eb.impl, online && sl->online, abort_running);
    }
    pthread_mutex_unlock(&s->mu);
}

static void ms__set_model_online(void *impl, int entry, bool online, bool abort_running) {
    ms_set *s = impl;
    if (entry < 0 || entry >= s->n) return;
    pthread_mutex_lock(&s->mu);
    ms_slot *sl = &s->slots[entry];
    sl->online = online;
    if (sl->state == MS_LOADED) sl->eb.set_online(sl->eb.impl, online && s->online, abort_running);
    pthread_mutex_unlock(&s->mu);
}

static ks_err ms__model_load(void *impl, int entry, bool load, ks_errbuf *eb) {
    ms_set *s = impl;
    if (entry < 0 || entry >= s->n) return ks_seterr(eb, KS_ERR_INVAL, "no such model");
    ks_err err = KS_OK;
    pthread_mutex_lock(&s->mu);
    ms_slot *sl = &s->slots[entry];
    if (load && sl->state != MS_LOADED && !sl->want) {
        sl->want = true;
        sl->want_ns = ks_now_ns();
        sl->err_ns = 0; // the admin asks again: no wait after a failure
    } else if (!load && sl->state == MS_LOADED) {
        if (sl->active > 0)
            err = ks_seterr(eb, KS_ERR_AGAIN, "the model '%s' has %d request(s) running; retry "
                            "once they end, or take it offline first", sl->name, sl->active);
        else
            sl->drop = true;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return err;
}

static const char *ms__model_status(void *impl, int entry) {
    ms_set *s = impl;
    if (entry < 0 || entry >= s->n) return NULL;
    pthread_mutex_lock(&s->mu);
    int st = s->slots[entry].state;
    if (st == MS_UNLOADED && s->slots[entry].want) st = MS_LOADING; // queued
    pthread_mutex_unlock(&s->mu);
    return st == MS_UNLOADING ? "unloaded" : ms__state_name[st];
}

static bool ms__is_model_online(void *impl, int entry) {
    ms_set *s = impl;
    if (entry < 0 || entry >= s->n) return false;
    pthread_mutex_lock(&s->mu);
    bool on = s->slots[entry].online;
    pthread_mutex_unlock(&s->mu);
    return on;
}

/* The sum over the models: the loaded engines' stats, and the counters of
 * those unloaded. */
static void ms__get_stats(void *impl, engine_stats *out) {
    ms_set *s = impl;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        ms_slot *sl = &s->slots[i];
        ms__stats_add_counters(out, &sl->retired);
        if (sl->state != MS_LOADED) continue;
        engine_stats st;
        sl->eb.get_stats(sl->eb.impl, &st);
        ms__stats_add_counters(out, &st);
        for (int k = 0; k < 4; k++) out->kv.pages[k] += st.kv.pages[k];
        out->kv.prefix_cached_pages += st.kv.prefix_cached_pages;
        out->n_queued += st.n_queued;
        out->n_running += st.n_running;
        out->n_paused += st.n_paused;
        out->adapter_bytes += st.adapter_bytes;
    }
    for (int i = 0; i < s->n; i++) // an unloaded model's adapters count: they load with it
        for (ms_adapter *a = s->slots[i].adapters; a; a = a->next) out->adapters++;
    pthread_mutex_unlock(&s->mu);
}

/* Pins every loaded engine, runs fn on each with mu released, unpins; the
 * first error (its message naming the model) wins. */
static ks_err ms__each_loaded(ms_set *s, ks_err (*fn)(ms_slot *sl, void *arg, ks_errbuf *eb),
                              void *arg, ks_errbuf *eb) {
    ks_err first = KS_OK;
    for (int i = 0; i < s->n; i++) {
        ms_slot *sl = &s->slots[i];
        pthread_mutex_lock(&s->mu);
        bool loaded = sl->state == MS_LOADED;
        if (loaded) sl->active++;
        pthread_mutex_unlock(&s->mu);
        if (!loaded) continue;
        ks_errbuf one = {0};
        ks_err err = fn(sl, arg, &one);
        ms__unpin(s, sl, 1);
        if (err && !first) first = ks_seterr(eb, err, "model %s: %s", sl->name, one.msg);
    }
    return first;
}

static ks_err ms__check_one(ms_slot *sl, void *arg, ks_errbuf *eb) {
    return sl->eb.check_quiescent(sl->eb.impl, *(uint32_t *)arg, eb);
}

static ks_err ms__check_quiescent(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    return ms__each_loaded(impl, ms__check_one, &timeout_ms, eb);
}

typedef struct ms_map_arg {
    uint32_t timeout_ms;
    engine_map *map; /* the maps appended, page after page */
} ms_map_arg;

static ks_err ms__map_one(ms_slot *sl, void *arg, ks_errbuf *eb) {
    ms_map_arg *a = arg;
    engine_map *m = NULL;
    ks_err err = sl->eb.map_pages(sl->eb.impl, a->timeout_ms, &m, eb);
    if (err) return err;
    if (!a->map) {
        a->map = m;
        return KS_OK;
    }
    // append m's pages to the map, its tenants merged by name
    engine_map *acc = a->map;
    uint8_t *st = realloc(acc->state, (size_t)acc->n_pages + m->n_pages + 1);
    if (st) acc->state = st;
    int8_t *ow = st ? realloc(acc->owner, (size_t)acc->n_pages + m->n_pages + 1) : NULL;
    if (ow) acc->owner = ow;
    if (!st || !ow) {
        engine_map_free(m);
        return ks_seterr(eb, KS_ERR_NOMEM, "no memory for the pool map");
    }
    int8_t remap[ENGINE_MAP_OWNERS];
    for (int t = 0; t < m->n_tenants; t++) {
        int k = 0;
        while (k < acc->n_tenants && strcmp(acc->tenant[k], m->tenant[t]) != 0) k++;
        if (k == acc->n_tenants && k < ENGINE_MAP_OWNERS) {
            snprintf(acc->tenant[k], sizeof acc->tenant[k], "%s", m->tenant[t]);
            acc->running[k] = 0;
            acc->n_tenants++;
        }
        remap[t] = (int8_t)(k < acc->n_tenants ? k : -1);
        if (k < acc->n_tenants) acc->running[k] += m->running[t];
    }
    for (uint32_t p = 0; p < m->n_pages; p++) {
        int8_t o = m->owner[p];
        acc->state[acc->n_pages + p] = m->state[p];
        acc->owner[acc->n_pages + p] =
            o >= 0 && o < m->n_tenants && remap[o] >= 0 ? remap[o] : (o >= 0 ? ENGINE_MAP_OTHER : o);
    }
    acc->n_pages += m->n_pages;
    engine_map_free(m);
    return KS_OK;
}

/* The loaded models' pools, one after the other (catalog order). */
static ks_err ms__map_pages(void *impl, uint32_t timeout_ms, engine_map **out, ks_errbuf *eb) {
    ms_map_arg a = {timeout_ms, NULL};
    ks_err err = ms__each_loaded(impl, ms__map_one, &a, eb);
    if (!err && !a.map && !(a.map = calloc(1, sizeof *a.map)))
        err = ks_seterr(eb, KS_ERR_NOMEM, "no memory for the pool map");
    if (err) {
        engine_map_free(a.map);
        a.map = NULL;
    }
    *out = a.map;
    return err;
}

/* Appends printf output to buf[*len..cap), cut at its end. */
static void ms__put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void ms__put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (k > 0) *len += (size_t)k < cap - *len ? (size_t)k : cap - *len - 1;
}

/* Per-model series: state, loads, unloads, failures, the last load's time,
 * the memory estimate; and the budget. */
static char *ms__metrics_text(void *impl) {
    ms_set *s = impl;
    size_t cap = 4096 + (size_t)s->n * 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
#define MS_PUT(...) ms__put(buf, cap, &len, __VA_ARGS__)
    pthread_mutex_lock(&s->mu);
    MS_PUT("# HELP kvseal_models_memory_budget_bytes --models-memory: what the loaded models may "
           "take (weights and KV pools)\n# TYPE kvseal_models_memory_budget_bytes gauge\n"
           "kvseal_models_memory_budget_bytes %llu\n",
           (unsigned long long)s->budget);
    MS_PUT("# HELP kvseal_models_memory_used_bytes the loaded and loading models' estimates\n"
           "# TYPE kvseal_models_memory_used_bytes gauge\nkvseal_models_memory_used_bytes %llu\n",
           (unsigned long long)s->used);
    MS_PUT("# HELP kvseal_model_loaded 1 when the model is loaded, else 0\n"
           "# TYPE kvseal_model_loaded gauge\n");
    for (int i = 0; i < s->n; i++)
        MS_PUT("kvseal_model_loaded{model=\"%s\",state=\"%s\"} %d\n", s->slots[i].label,
               ms__state_name[s->slots[i].state], s->slots[i].state == MS_LOADED);
    MS_PUT("# HELP kvseal_model_memory_bytes the model's estimate (weights + KV pool)\n"
           "# TYPE kvseal_model_memory_bytes gauge\n");
    for (int i = 0; i < s->n; i++)
        MS_PUT("kvseal_model_memory_bytes{model=\"%s\"} %llu\n", s->slots[i].label,
               (unsigned long long)ms__bytes(&s->slots[i]));
    static const char *const what[3] = {"loads", "unloads", "load_failures"};
    for (int w = 0; w < 3; w++) {
        MS_PUT("# HELP kvseal_model_%s_total model %s since start\n# TYPE kvseal_model_%s_total "
               "counter\n",
               what[w], w == 0 ? "loads" : w == 1 ? "unloads (least recently used)" : "failed loads",
               what[w]);
        for (int i = 0; i < s->n; i++) {
            const ms_slot *sl = &s->slots[i];
            MS_PUT("kvseal_model_%s_total{model=\"%s\"} %llu\n", what[w], sl->label,
                   (unsigned long long)(w == 0 ? sl->loads : w == 1 ? sl->unloads : sl->failures));
        }
    }
    MS_PUT("# HELP kvseal_model_load_seconds the model's last load\n"
           "# TYPE kvseal_model_load_seconds gauge\n");
    for (int i = 0; i < s->n; i++)
        MS_PUT("kvseal_model_load_seconds{model=\"%s\"} %.3f\n", s->slots[i].label,
               s->slots[i].load_s);
    pthread_mutex_unlock(&s->mu);
#undef MS_PUT
    return buf;
}

// ----------------------------------------------------------------------------
// The catalog

/* Frees the set's models (engines first); the loader must be stopped. */
static void ms__adapter_free(ms_adapter *a) {
    if (a->data) explicit_bzero(a->data, a->len); // the tenant's fine-tune
    free(a->data);
    free(a);
}

/* Pins sl's engine if it is loaded (amu held): the caller then works on it
 * with mu released and unpins. NULL: not loaded (its list is what counts). */
static engine *ms__adapter_pin(ms_set *s, ms_slot *sl) {
    pthread_mutex_lock(&s->mu);
    engine *e = sl->state == MS_LOADED ? sl->e : NULL;
    if (e) sl->active++;
    pthread_mutex_unlock(&s->mu);
    return e;
}

static ks_err ms__adapter_add(void *impl, int entry, const engine_adapter_spec *sp, ks_errbuf *eb) {
    ms_set *s = impl;
    ms_slot *sl = &s->slots[entry];
    // checked against the model's shape now (its unpacked copy), loaded into
    // its engine now if it runs, and at every later load
    gguf_file *f = NULL;
    model_lora *l = NULL;
    ks_err err = gguf_open_mem(sp->data, sp->len, sp->name, &f, eb);
    if (!err) err = model_lora_load_file(sl->hm, f, &l, eb);
    model_lora_free(l);
    if (err) return err;
    ms_adapter *a = calloc(1, sizeof *a);
    if (!a || !(a->data = malloc(sp->len ? sp->len : 1))) {
        free(a);
        return ks_seterr(eb, KS_ERR_NOMEM, "adapter");
    }
    snprintf(a->tenant, sizeof a->tenant, "%s", sp->tenant ? sp->tenant : "default");
    snprintf(a->name, sizeof a->name, "%s", sp->name);
    a->is_public = sp->is_public;
    a->scale = sp->scale;
    memcpy(a->data, sp->data, sp->len);
    a->len = sp->len;
    pthread_mutex_lock(&sl->amu);
    ms_adapter **tail = &sl->adapters;
    for (ms_adapter *b = *tail; b && !err; tail = &b->next, b = b->next)
        if (!strcmp(b->name, a->name) &&
            (!strcmp(b->tenant, a->tenant) || (b->is_public && a->is_public)))
            err = ks_seterr(eb, KS_ERR_EXISTS, "%s '%s'",
                            strcmp(b->tenant, a->tenant) ? "a public adapter is already named"
                                                         : "this tenant already has an adapter named",
                            a->name);
    engine *e = err ? NULL : ms__adapter_pin(s, sl);
    if (e) { // the slow part, with mu released: other models admit meanwhile
        err = engine_adapter_add(e, sp, eb);
        ms__unpin(s, sl, 1);
    }
    if (!err) {
        pthread_mutex_lock(&s->mu);
        *tail = a;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&sl->amu);
    if (err) ms__adapter_free(a);
    return err;
}

static ks_err ms__adapter_remove(void *impl, int entry, const char *tenant, const char *name,
                                 ks_errbuf *eb) {
    ms_set *s = impl;
    ms_slot *sl = &s->slots[entry];
    ms_adapter *found = NULL;
    pthread_mutex_lock(&sl->amu);
    pthread_mutex_lock(&s->mu);
    for (ms_adapter **pp = &sl->adapters; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->tenant, tenant) && !strcmp((*pp)->name, name)) {
            found = *pp;
            *pp = found->next;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    engine *e = found ? ms__adapter_pin(s, sl) : NULL;
    if (e) {
        if (engine_adapter_remove(e, tenant, name, eb))
            ks_log(KS_LOG_ERROR, "model %s: a LoRA adapter was not in its engine", sl->name);
        ms__unpin(s, sl, 1);
    }
    pthread_mutex_unlock(&sl->amu);
    if (!found)
        return admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND, "The adapter '%.64s' does not exist", name);
    ms__adapter_free(found);
    return KS_OK;
}

static int ms__adapter_list(void *impl, int entry, const char *tenant, engine_adapter_info *out,
                            int cap) {
    ms_set *s = impl;
    ms_slot *sl = &s->slots[entry];
    int n = 0;
    pthread_mutex_lock(&s->mu);
    if (sl->state == MS_LOADED) n = engine_adapter_list(sl->e, tenant, out, cap);
    else
        for (ms_adapter *a = sl->adapters; a; a = a->next) { // loaded with the model
            if (tenant && strcmp(a->tenant, tenant) && !a->is_public) continue;
            if (n < cap) {
                memset(&out[n], 0, sizeof out[n]);
                snprintf(out[n].tenant, sizeof out[n].tenant, "%s", a->tenant);
                snprintf(out[n].name, sizeof out[n].name, "%s", a->name);
                out[n].is_public = a->is_public;
                out[n].scale = a->scale;
            }
            n++;
        }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void ms__free(ms_set *s) {
    for (int i = 0; i < s->n; i++) {
        ms_slot *sl = &s->slots[i];
        if (sl->e) ms__unload(s, sl);
        while (sl->adapters) {
            ms_adapter *a = sl->adapters;
            sl->adapters = a->next;
            ms__adapter_free(a);
        }
        pthread_mutex_destroy(&sl->amu);
        model_free(sl->hm);
        free(sl->path);
        for (int k = 0; k < sl->n_aliases; k++) free(sl->alias_buf[k]);
    }
    free(s->slots);
    s->slots = NULL;
    s->n = 0;
}

/* Appends a model at path (aliases from a comma list, may be NULL). */
static int ms__add(ms_set *s, const char *path, const char *alias_list) {
    ms_slot *ns = realloc(s->slots, sizeof *ns * (size_t)(s->n + 1));
    if (!ns) return fprintf(stderr, "kvseal: out of memory\n"), 1;
    s->slots = ns;
    ms_slot *sl = &s->slots[s->n];
    memset(sl, 0, sizeof *sl);
    sl->index = s->n;
    sl->online = true;
    if (!(sl->path = strdup(path))) return fprintf(stderr, "kvseal: out of memory\n"), 1;
    s->n++;
    serve__model_name(path, sl->name, sizeof sl->name);
    size_t k = 0;
    for (const char *p = sl->name; *p && k + 3 < sizeof sl->label; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n') sl->label[k++] = '\\';
        sl->label[k++] = *p == '\n' ? 'n' : *p;
    }
    sl->label[k] = '\0';
    for (const char *a = alias_list; a && *a;) {
        size_t n = strcspn(a, ",");
        if (n && sl->n_aliases < SERVE_MAX_ALIASES) {
            if (!(sl->alias_buf[sl->n_aliases] = strndup(a, n)))
                return fprintf(stderr, "kvseal: out of memory\n"), 1;
            sl->aliases[sl->n_aliases] = sl->alias_buf[sl->n_aliases];
            sl->n_aliases++;
        }
        a += n + (a[n] == ',');
    }
    return 0;
}

static int ms__name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds every *.gguf of dir (sorted by name; hidden files, split files and
 * what is not a regular file skipped). */
static int ms__scan_dir(ms_set *s, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "kvseal serve: --models-dir %s: %s\n", dir, strerror(errno));
        return 2;
    }
    char **names = NULL;
    int n = 0, rc = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len <= 5 || strcasecmp(de->d_name + len - 5, ".gguf")) continue;
        char **nn = realloc(names, sizeof *nn * (size_t)(n + 1));
        if (!nn || !(nn[n] = strdup(de->d_name))) {
            if (nn) names = nn;
            rc = 1;
            break;
        }
        names = nn;
        n++;
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, ms__name_cmp);
    for (int i = 0; i < n && !rc; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (strstr(names[i], "-of-")) {
            ks_log(KS_LOG_WARN, "--models-dir: skipping %s (split GGUF files are not supported)",
                   names[i]);
            continue;
        }
        rc = ms__add(s, path, NULL);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) fprintf(stderr, "kvseal: out of memory\n");
    return rc;
}

/* Applies models.json (an object keyed by model name, each with "aliases",
 * "ctx", "kv_pages", "kv_memory", "preload"); a missing default file is
 * fine, a given one must exist. Unknown keys and names are refused. */
static int ms__config(ms_set *s, const char *path, bool given) {
    struct stat st;
    if (!given && stat(path, &st) != 0) return 0;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fprintf(stderr, "kvseal serve: %s:%d: %s\n", path, je.line, je.text);
        return 2;
    }
    int rc = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(root)) {
        fprintf(stderr, "kvseal serve: %s: want an object keyed by model name\n", path);
        rc = 2;
    }
    json_object_foreach(root, key, v) {
        if (rc) break;
        ms_slot *sl = NULL;
        for (int i = 0; i < s->n && !sl; i++)
            if (!strcmp(s->slots[i].name, key)) sl = &s->slots[i];
        if (!sl) {
            fprintf(stderr, "kvseal serve: %s: no model named '%s' is served (names are the files' "
                    "basenames without .gguf)\n", path, key);
            rc = 2;
            break;
        }
        if (!json_is_object(v)) {
            fprintf(stderr, "kvseal serve: %s: '%s': want an object\n", path, key);
            rc = 2;
            break;
        }
        const char *k2;
        json_t *x;
        json_object_foreach(v, k2, x) {
            bool ok = true;
            if (!strcmp(k2, "aliases")) {
                size_t i;
                json_t *a;
                ok = json_is_array(x);
                json_array_foreach(x, i, a) {
                    if (!ok) break;
                    const char *as = json_string_value(a);
                    ok = as && *as && sl->n_aliases < SERVE_MAX_ALIASES &&
                         (sl->alias_buf[sl->n_aliases] = strdup(as));
                    if (ok) sl->aliases[sl->n_aliases] = sl->alias_buf[sl->n_aliases], sl->n_aliases++;
                }
            } else if (!strcmp(k2, "ctx") || !strcmp(k2, "kv_pages")) {
                json_int_t iv = json_integer_value(x);
                ok = json_is_integer(x) && iv >= 1 && iv <= (k2[0] == 'c' ? (1 << 24) : UINT32_MAX);
                if (ok) *(k2[0] == 'c' ? &sl->ctx : &sl->kv_pages) = (long)iv;
            } else if (!strcmp(k2, "kv_memory")) {
                ok = json_is_string(x) ? serve__parse_bytes(json_string_value(x), &sl->kv_memory)
                     : json_is_integer(x) && json_integer_value(x) > 0;
                if (ok && json_is_integer(x)) sl->kv_memory = (uint64_t)json_integer_value(x);
            } else if (!strcmp(k2, "preload")) {
                ok = json_is_boolean(x);
                sl->preload = json_is_true(x);
            } else {
                fprintf(stderr, "kvseal serve: %s: '%s': unknown key '%s' (aliases, ctx, kv_pages, "
                        "kv_memory, preload)\n", path, key, k2);
                rc = 2;
                break;
            }
            if (!ok) {
                fprintf(stderr, "kvseal serve: %s: '%s': bad value for '%s'\n", path, key, k2);
                rc = 2;
                break;
            }
        }
        if (!rc && sl->kv_pages && sl->kv_memory) {
            fprintf(stderr, "kvseal serve: %s: '%s': kv_pages or kv_memory, not both\n", path, key);
            rc = 2;
        }
    }
    json_decref(root);
    return rc;
}

/* Builds the catalog from c: the -m models in order (the first only when
 * one was given explicitly or no --models-dir), then DIR's, then the
 * config. Names must be unique across names and aliases. */
static int ms__catalog(ms_set *s, const serve__cfg *c) {
    int rc = 0;
    if (c->n_models_given || !c->models_dir) {
        char list[4096] = "";
        for (int i = 0, n = 0; i < c->n_aliases; i++)
            n += snprintf(list + n, sizeof list - (size_t)n, "%s%s", i ? "," : "", c->aliases[i]);
        if ((rc = ms__add(s, c->model_path, list))) return rc;
    }
    for (int i = 0; i < c->n_more_models && !rc; i++) {
        const char *spec = c->more_models[i], *comma = strchr(spec, ',');
        char *path = comma ? strndup(spec, (size_t)(comma - spec)) : strdup(spec);
        if (!path) return 1;
        rc = ms__add(s, path, comma ? comma + 1 : NULL);
        free(path);
    }
    if (!rc && c->models_dir) rc = ms__scan_dir(s, c->models_dir);
    if (rc) return rc;
    if (c->models_config) {
        rc = ms__config(s, c->models_config, true);
    } else if (c->models_dir) {
        char p[4096];
        snprintf(p, sizeof p, "%s/models.json", c->models_dir);
        rc = ms__config(s, p, false);
    }
    if (rc) return rc;
    if (s->n == 0) {
        fprintf(stderr, "kvseal serve: --models-dir %s holds no .gguf file\n", c->models_dir);
        return 2;
    }
    for (int i = 0; i < s->n; i++) // every name and alias names one model
        for (int a = -1; a < s->slots[i].n_aliases; a++) {
            const char *x = a < 0 ? s->slots[i].name : s->slots[i].aliases[a];
            for (int j = 0; j <= i; j++)
                for (int b = -1; b < s->slots[j].n_aliases; b++) {
                    if (j == i && b >= a) break;
                    const char *y = b < 0 ? s->slots[j].name : s->slots[j].aliases[b];
                    if (strcmp(x, y) != 0) continue;
                    if (j == i) continue; // a model's alias repeating its own name
                    fprintf(stderr, "kvseal serve: two models answer to '%s' (%s and %s)\n", x,
                            s->slots[j].path, s->slots[i].path);
                    return 2;
                }
        }
    return 0;
}

/* Reads each model's tokenizer and shape, sizes its pool and checks it
 * (I8) as a one-model serve would, reporting to report. */
static int ms__prepare(ms_set *s, const serve__cfg *c, FILE *report) {
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        ms_slot *sl = &s->slots[i];
        ks_errbuf eb = {0};
        if (stat(sl->path, &sl->st0) != 0) {
            ks_log(KS_LOG_ERROR, "serve: model %s: %s: %s", sl->name, sl->path, strerror(errno));
            return 1;
        }
        if (model_load_unpacked(sl->path, &sl->hm, &eb) ||
            model_kv_type_check(sl->hm, c->kv_type, &eb)) {
            ks_log(KS_LOG_ERROR, "serve: model %s: %s", sl->name, eb.msg);
            return 1;
        }
        serve__cfg mc = *c; // this model's settings: the command line's, then models.json's
        if (sl->ctx) mc.ctx = sl->ctx;
        if (sl->kv_pages || sl->kv_memory) mc.kv_pages = sl->kv_pages, mc.kv_memory = sl->kv_memory;
        serve__engine_opts(&mc, sl->hm, &sl->o);
        kv_geom g = model_kv_geom(sl->hm, sl->o.page_tokens, sl->o.kv_type);
        sl->kv_bytes = (uint64_t)sl->o.kv_pages * kv_page_bytes(&g);
        sl->file_bytes = (uint64_t)sl->st0.st_size;
        char buf[1024];
        bool warn = false;
        ks_err e = engine_capacity_check(&sl->o, &warn, buf, sizeof buf);
        for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            if (report == stderr)
                ks_log(KS_LOG_INFO, "model %s: %s", sl->name, line);
            else
                fprintf(report, "model %s: %s\n", sl->name, line);
        }
        sl->o.sizing_logged = true;
        if (e) {
            ks_log(KS_LOG_ERROR,
                   "serve: model %s: the KV pool cannot hold one request of the advertised context "
                   "length %d (I8); raise kv_pages/kv_memory or lower ctx",
                   sl->name, sl->o.n_ctx);
            rc = 1;
        } else if (warn) {
            ks_log(KS_LOG_WARN, "model %s: the KV pool holds less than 2 requests of the full "
                   "context (%d tokens)", sl->name, sl->o.n_ctx);
        }
        if (!rc && ms__bytes(sl) > s->budget) {
            ks_log(KS_LOG_ERROR,
                   "serve: model %s needs about %.0f MB (weights %.0f + KV pool %.0f) but "
                   "--models-memory is %.0f MB: it could never load",
                   sl->name, (double)ms__bytes(sl) / 1e6, (double)sl->file_bytes / 1e6,
                   (double)sl->kv_bytes / 1e6, (double)s->budget / 1e6);
            rc = 1;
        }
        if (report != stderr)
            fprintf(report, "model %s: about %.0f MB loaded (weights %.0f, KV pool %.0f)\n",
                    sl->name, (double)ms__bytes(sl) / 1e6, (double)sl->file_bytes / 1e6,
                    (double)sl->kv_bytes / 1e6);
    }
    return rc;
}

bool serve__multi(const serve__cfg *c, const char *cmd) {
    return (!strcmp(cmd, "serve") || !strcmp(cmd, "check")) &&
           (c->models_dir || c->n_more_models > 0);
}

int serve__models_main(const char *cmd, serve__cfg *c, FILE *report) {
    static ms_set set; // borrowed by the server for its lifetime
    ms_set *s = &set;
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->online = true;
    s->budget = c->models_memory ? c->models_memory : serve__mem_available() / 4 * 3;
    if (!s->budget) s->budget = UINT64_MAX; // MemAvailable unknown: no budget but the count
    s->max_loaded = (int)c->models_max_loaded;
    int rc = ms__catalog(s, c);
    for (int i = 0; i < s->n; i++) // here: the catalog's realloc may move a slot
        pthread_mutex_init(&s->slots[i].amu, NULL);
    if (!rc) rc = ms__prepare(s, c, report);
    if (rc || strcmp(cmd, "serve") != 0) {
        if (!rc && report != stderr)
            fprintf(report, "%d models; --models-memory %.0f MB%s\n", s->n,
                    (double)s->budget / 1e6, s->max_loaded ? "" : " (no count limit)");
        ms__free(s);
        return rc;
    }
    // serve: as a one-model serve from here, over the backend above
    ks_errbuf eb = {0};
    sigset_t sigs;
    serve__block_signals(&sigs);
    server_seclog *sl = NULL;
    server *srv = NULL;
    server_model *more = calloc((size_t)s->n, sizeof *more);
    rc = 1;
    if (!more) goto done;
    if (server_seclog_open(c->security_log, &sl, &eb)) goto fail;
    for (int i = 0; i < s->n; i++) {
        s->slots[i].o.on_security_event = server_seclog_write;
        s->slots[i].o.event_ctx = sl;
        more[i] = (server_model){.m = s->slots[i].hm, .name = s->slots[i].name,
                                 .aliases = s->slots[i].aliases,
                                 .n_aliases = s->slots[i].n_aliases, .n_ctx = s->slots[i].o.n_ctx};
    }
    if (pthread_create(&s->loader, NULL, ms__loader, s) != 0) {
        ks_seterr(&eb, KS_ERR_INTERNAL, "cannot start the model loader thread");
        goto fail;
    }
    s->loader_on = true;
    server_backend be = {
        .impl = s,
        .submit = ms__submit,
        .next = ms__next,
        .cancel = ms__cancel,
        .release = ms__release,
        .set_notify = ms__set_notify,
        .is_online = ms__is_online,
        .set_online = ms__set_online,
        .get_stats = ms__get_stats,
        .check_quiescent = ms__check_quiescent,
        .submit_n = ms__submit_n,
        .embed_submit = ms__embed_submit,
        .embed_vector = ms__embed_vector,
        .set_model_online = ms__set_model_online,
        .is_model_online = ms__is_model_online,
        .model_status = ms__model_status,
        .model_load = ms__model_load,
        .metrics_text = ms__metrics_text,
        .map_pages = ms__map_pages,
        .adapter_add = ms__adapter_add,
        .adapter_remove = ms__adapter_remove,
        .adapter_list = ms__adapter_list,
    };
    serve__cfg c0 = *c; // entry 0's aliases are its slot's (models.json may add some)
    c0.n_aliases = s->slots[0].n_aliases;
    for (int k = 0; k < c0.n_aliases; k++) c0.aliases[k] = s->slots[0].aliases[k];
    if (serve__http_start(&c0, s->slots[0].o.n_ctx, s->slots[0].name, &be, s->slots[0].hm, more + 1,
                          s->n - 1, &srv, &eb))
        goto fail;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++)
        if (s->slots[i].preload) {
            s->slots[i].want = true;
            s->slots[i].want_ns = ks_now_ns() + (uint64_t)i; // in catalog order
        }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    ks_log(KS_LOG_INFO, "serving %d models (loaded on first use; --models-memory %.0f MB%s), kernels %s",
           s->n, (double)s->budget / 1e6, s->max_loaded ? ", a count limit" : "", kern_get()->name);
    serve__run_until_signal(srv, &be, &sigs, c->drain_timeout_ms);
    rc = 0;
    goto done;
fail:
    ks_log(KS_LOG_ERROR, "serve: %s", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
    cli__notify("STATUS=failed: %s", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
done:
    server_destroy(srv);
    if (s->loader_on) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->loader, NULL);
    }
    ms__free(s);
    free(more);
    server_seclog_close(sl);
    return rc;
}
