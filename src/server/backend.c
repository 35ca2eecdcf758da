/* backend.c — the local engine as a server_backend: engine.h's calls
 * behind void * handles (the cluster's router supplies its own). */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// The local engine as a backend: engine.h's calls, with void * handles.
static ks_err srv__eng_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    engine_req *r = NULL;
    ks_err e = engine_submit(impl, p, &r, eb);
    *req = r;
    return e;
}
static ks_err srv__eng_submit_n(void *impl, const engine_params *p, int n, void **reqs,
                                ks_errbuf *eb) {
    engine_req *r[ENGINE_MAX_N] = {0};
    ks_err e = engine_submit_n(impl, p, n, r, eb);
    for (int i = 0; i < n && i < ENGINE_MAX_N; i++)
        reqs[i] = r[i];
    return e;
}
static ks_err srv__eng_next(void *req, engine_event *ev, uint32_t timeout_ms) {
    return engine_req_next(req, ev, timeout_ms);
}
static void srv__eng_cancel(void *req) { engine_req_cancel(req); }
static void srv__eng_release(void *req) { engine_req_release(req); }
static bool srv__eng_is_online(void *impl) { return engine_is_online(impl); }
static void srv__eng_set_online(void *impl, bool online, bool abort_running) {
    engine_set_online(impl, online, abort_running);
}
static void srv__eng_get_stats(void *impl, engine_stats *out) { engine_get_stats(impl, out); }
static void srv__eng_set_notify(void *req, void (*fn)(void *), void *ctx) {
    engine_req_set_notify(req, fn, ctx);
}
static ks_err srv__eng_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    return engine_check_quiescent(impl, timeout_ms, eb);
}

static ks_err srv__eng_map(void *impl, uint32_t timeout_ms, engine_map **out, ks_errbuf *eb) {
    return engine_map_pages(impl, timeout_ms, out, eb);
}

static ks_err srv__eng_embed_submit(void *impl, const engine_embed_params *p, void **req,
                                    ks_errbuf *eb) {
    engine_req *r = NULL;
    ks_err e = engine_embed_submit(impl, p, &r, eb);
    *req = r;
    return e;
}
static ks_err srv__eng_embed_vector(void *req, float *out, int32_t cap) {
    return engine_req_embedding(req, out, cap);
}

static ks_err srv__eng_adapter_add(void *impl, int entry, const engine_adapter_spec *s,
                                   ks_errbuf *eb) {
    (void)entry; // one model
    return engine_adapter_add(impl, s, eb);
}
static ks_err srv__eng_adapter_remove(void *impl, int entry, const char *tenant, const char *name,
                                      ks_errbuf *eb) {
    (void)entry;
    return engine_adapter_remove(impl, tenant, name, eb);
}
static int srv__eng_adapter_list(void *impl, int entry, const char *tenant,
                                 engine_adapter_info *out, int cap) {
    (void)entry;
    return engine_adapter_list(impl, tenant, out, cap);
}

void server_engine_backend(engine *e, server_backend *out) {
    *out = (server_backend){.impl = e,
                            .submit = srv__eng_submit,
                            .next = srv__eng_next,
                            .cancel = srv__eng_cancel,
                            .release = srv__eng_release,
                            .set_notify = srv__eng_set_notify,
                            .is_online = srv__eng_is_online,
                            .set_online = srv__eng_set_online,
                            .get_stats = srv__eng_get_stats,
                            .check_quiescent = srv__eng_check,
                            .submit_n = srv__eng_submit_n,
                            .embed_submit = srv__eng_embed_submit,
                            .embed_vector = srv__eng_embed_vector,
                            .map_pages = srv__eng_map,
                            .adapter_add = srv__eng_adapter_add,
                            .adapter_remove = srv__eng_adapter_remove,
                            .adapter_list = srv__eng_adapter_list};
}

