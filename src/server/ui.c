/* The web pages: the chat page at /, the operator's page at /admin, their
 * scripts and style under /ui/, compiled into the binary from web/
 * (scripts/embed.cmake). The pages carry no key and no data: the chat page
 * keeps the tenant's API key in the browser (localStorage) and calls the
 * API routes with it; the admin page keeps the admin key likewise and
 * polls GET /admin/pool, the one route that names tenants beside their
 * pages (the admin key's alone). */
#include "http_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct srv_ui_asset {
    const char *path, *type;
    const unsigned char *data;
    size_t len;
} srv_ui_asset;
extern const srv_ui_asset srv_ui_assets[]; // build/gen/ui_assets.c

/* Scripts and styles from this origin only, no inline script, no framing:
 * a page that holds a key must not run anyone else's code. */
#define SRV_UI_CSP                                                                                 \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                \
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

enum MHD_Result srv__ui(server *s, struct MHD_Connection *c, const srv_call *q) {
    const srv_ui_asset *a = NULL;
    for (const srv_ui_asset *x = srv_ui_assets; x->path && !a; x++)
        if (!strcmp(x->path, q->path)) a = x;
    if (!a) {
        srv_error err;
        srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL, "Invalid URL (GET %s)", q->path);
        return srv__reply_error(s, c, SRV_ROUTE_UI, &err);
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, a->type);
    MHD_add_response_header(r, "Content-Security-Policy", SRV_UI_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    srv__decorate(s, c, r, 200);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    srv_metrics_request(&s->met, SRV_ROUTE_UI, 200);
    return ret;
}

static void *srv__pool_job(void *arg) {
    srv_job *j = arg;
    memset(&j->eb, 0, sizeof j->eb);
    j->err =
        j->s->b.map_pages ? j->s->b.map_pages(j->s->b.impl, j->timeout_ms, &j->map, &j->eb) : KS_OK;
    j->s->b.get_stats(j->s->b.impl, &j->st);
    atomic_store(&j->done, true);
    MHD_resume_connection(j->c);
    return NULL;
}

enum MHD_Result srv__pool(server *s, struct MHD_Connection *c, const srv_call *q) {
    srv_job *j = calloc(1, sizeof *j);
    pthread_t th;
    pthread_attr_t at;
    if (!j) return MHD_NO;
    // the map waits for a step boundary: a prefill chunk can take a second
    *j = (srv_job){.s = s, .c = c, .timeout_ms = 5000, .pool_map = true};
    q->sc->job = j;
    MHD_suspend_connection(c); // before the thread can resume it
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    bool started = pthread_create(&th, &at, srv__pool_job, j) == 0;
    pthread_attr_destroy(&at);
    if (!started) {
        j->err = ks_seterr(&j->eb, KS_ERR_NOMEM, "cannot start the pool map");
        atomic_store(&j->done, true);
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

/* The map as runs [state, owner, pages] (pages are handed out from a free
 * list, so neighbours often share both), and each owner's page count. */
static json_t *srv__pool_runs(const engine_map *m, uint32_t *pages /* OUT: (n_tenants) */) {
    json_t *runs = json_array();
    for (uint32_t p = 0; runs && p < m->n_pages;) {
        uint32_t q = p + 1;
        while (q < m->n_pages && m->state[q] == m->state[p] && m->owner[q] == m->owner[p])
            q++;
        if (m->owner[p] >= 0) pages[m->owner[p]] += q - p;
        if (json_array_append_new(
                runs, json_pack("[i, i, i]", m->state[p], m->owner[p], (json_int_t)(q - p))))
            json_decref(runs), runs = NULL;
        p = q;
    }
    return runs;
}

enum MHD_Result srv__pool_answer(server *s, struct MHD_Connection *c, srv_conn *sc) {
    srv_job *j = sc->job;
    sc->job = NULL;
    const engine_stats *st = &j->st;
    json_t *o = json_pack(
        "{s:{s:i, s:i, s:i, s:i, s:I, s:I, s:I}, s:{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I}}",
        "pool", "free", st->kv.pages[KV_PAGE_FREE], "allocated", st->kv.pages[KV_PAGE_ALLOCATED],
        "ready", st->kv.pages[KV_PAGE_READY], "quarantined", st->kv.pages[KV_PAGE_QUARANTINE],
        "prefix_cached_pages", (json_int_t)st->kv.prefix_cached_pages, "violations",
        (json_int_t)st->kv.violations, "allocations", (json_int_t)st->kv.allocations, "engine",
        "queued", st->n_queued, "running", st->n_running, "paused", st->n_paused, "finished",
        (json_int_t)st->n_finished, "aborted", (json_int_t)st->n_aborted, "rejected",
        (json_int_t)st->n_rejected, "tokens_in", (json_int_t)st->tokens_in, "tokens_out",
        (json_int_t)st->tokens_out, "violations", (json_int_t)st->n_violations);
    json_t *usage = json_array();
    for (size_t i = 0; usage && i < s->ts->n; i++) {
        srv_tenant *t = &s->ts->t[i];
        json_array_append_new(usage,
                              json_pack("{s:s, s:I, s:I, s:I, s:I}", "name", t->name, "requests",
                                        (json_int_t)atomic_load(&t->m_requests), "rate_limited",
                                        (json_int_t)atomic_load(&t->m_limited), "prompt_tokens",
                                        (json_int_t)atomic_load(&t->m_prompt), "generation_tokens",
                                        (json_int_t)atomic_load(&t->m_generation)));
    }
    if (o && usage) json_object_set_new(o, "tenants", usage), usage = NULL;
    json_decref(usage);
    if (o && j->map) { // the map: pages by state and by the tenant holding them
        const engine_map *m = j->map;
        uint32_t pages[ENGINE_MAP_OWNERS] = {0};
        json_t *runs = srv__pool_runs(m, pages), *owners = json_array();
        for (int t = 0; owners && t < m->n_tenants; t++)
            json_array_append_new(owners, json_pack("{s:s, s:i, s:i}", "name", m->tenant[t],
                                                    "running", m->running[t], "pages", pages[t]));
        json_t *mo =
            json_pack("{s:i, s:o*, s:o*}", "pages", m->n_pages, "runs", runs, "owners", owners);
        if (mo) json_object_set_new(o, "map", mo);
    } else if (o) {
        json_object_set_new(o, "map", json_null());
        if (j->err != KS_OK)
            json_object_set_new(o, "map_error",
                                json_string(j->eb.msg[0] ? j->eb.msg : ks_strerror(j->err)));
    }
    engine_map_free(j->map);
    free(j);
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200, o);
}
