/* adapters.c — LoRA adapters at the HTTP front: the tenants file's entries
 * loaded at start, and the admin routes that add, list and remove them
 * (docs/api.md "LoRA adapters"). The engine keeps them (engine.h "LoRA
 * adapters"); here only names, owners and files are handled. An adapter
 * name a request gives is resolved by the engine under the request's
 * tenant, so nothing here decides who may use one. */
#include "http_int.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads the whole file at path into *buf (malloc'd) / *len. */
static ks_err srv__read_file(const char *path, uint8_t **buf, size_t *len, ks_errbuf *eb) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ks_seterr(eb, KS_ERR_IO, "%s: %s", path, strerror(errno));
    srv_buf b = {0};
    char chunk[1 << 16];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        ok = srv_buf_add(&b, chunk, n);
    bool rerr = ferror(f);
    fclose(f);
    if (!ok || rerr) {
        srv_buf_free(&b);
        return ks_seterr(eb, ok ? KS_ERR_IO : KS_ERR_NOMEM, "%s: %s", path,
                         ok ? "read error" : "out of memory");
    }
    *buf = (uint8_t *)b.p;
    *len = b.len;
    return KS_OK;
}

/* The catalog entry named model (NULL: the first), or -1. */
static int srv__adapter_entry(const server *s, const char *mname) {
    const srv_model *sm = mname ? srv__model_find(s, mname) : &s->mods[0];
    return sm ? sm->index : -1;
}

ks_err srv__load_adapters(server *s, ks_errbuf *eb) {
    for (size_t i = 0; i < s->ts->n; i++) {
        const srv_tenant *t = &s->ts->t[i];
        for (size_t k = 0; k < t->n_adapters; k++) {
            const srv_tenant_adapter *ta = &t->adapters[k];
            if (!s->b.adapter_add)
                return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                                 "tenant \"%s\" adapter \"%s\": this server holds no LoRA adapters",
                                 t->name, ta->name);
            int entry = srv__adapter_entry(s, ta->model);
            if (entry < 0)
                return ks_seterr(eb, KS_ERR_INVAL,
                                 "tenant \"%s\" adapter \"%s\": no model named \"%s\" is served",
                                 t->name, ta->name, ta->model);
            uint8_t *buf;
            size_t len;
            ks_errbuf feb = {0};
            ks_err e = srv__read_file(ta->path, &buf, &len, &feb);
            engine_adapter_spec sp = {.tenant = t->name, .name = ta->name,
                                      .is_public = ta->is_public, .scale = ta->scale,
                                      .data = buf, .len = len};
            if (!e) e = s->b.adapter_add(s->b.impl, entry, &sp, &feb);
            if (buf) sodium_memzero(buf, len);
            free(buf);
            if (e)
                return ks_seterr(eb, e, "tenant \"%s\" adapter \"%s\": %s", t->name, ta->name,
                                 feb.msg);
            ks_log(KS_LOG_INFO, "LoRA adapter loaded for a tenant from the tenants file (%zu bytes)",
                   len);
        }
    }
    return KS_OK;
}

/* One adapter as the admin routes show it. */
static json_t *srv__adapter_json(const server *s, int entry, const engine_adapter_info *a) {
    char hex[2 * ENGINE_ADAPTER_DIGEST_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, a->digest, sizeof a->digest);
    return json_pack("{s:s, s:s, s:s, s:b, s:f, s:i, s:i, s:I, s:i, s:s}", "tenant", a->tenant,
                     "name", a->name, "model", srv__model_primary(&s->mods[entry]), "public",
                     a->is_public, "scale", (double)a->scale, "rank", (int)a->rank, "n_mats",
                     (int)a->n_mats, "bytes", (json_int_t)a->bytes, "running", (int)a->running,
                     "sha256", hex);
}

/* The admin's answer about one adapter after an add (first match by owner and name). */
static json_t *srv__adapter_find_json(server *s, int entry, const char *tenant, const char *name) {
    int n = s->b.adapter_list(s->b.impl, entry, NULL, NULL, 0);
    engine_adapter_info *all = n > 0 ? calloc((size_t)n, sizeof *all) : NULL;
    json_t *j = NULL;
    if (all) {
        n = s->b.adapter_list(s->b.impl, entry, NULL, all, n);
        for (int i = 0; i < n && !j; i++)
            if (!strcmp(all[i].tenant, tenant) && !strcmp(all[i].name, name))
                j = srv__adapter_json(s, entry, &all[i]);
    }
    free(all);
    return j ? j : json_pack("{s:s, s:s}", "tenant", tenant, "name", name);
}

/* A query argument of the request, or NULL. */
static const char *srv__arg(struct MHD_Connection *c, const char *k) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
}

/* Whether the tenants file (or the anonymous server's "default") has name. */
static bool srv__tenant_known(const server *s, const char *name) {
    for (size_t i = 0; i < s->ts->n; i++)
        if (!strcmp(s->ts->t[i].name, name)) return true;
    return false;
}

/* POST /admin/adapters?tenant=T&name=N[&public=true][&scale=S][&model=M], the
 * body the adapter's GGUF file. */
static enum MHD_Result srv__adapter_post(server *s, struct MHD_Connection *c, const srv_call *q) {
    srv_error err;
    const char *tenant = srv__arg(c, "tenant"), *name = srv__arg(c, "name"),
               *mname = srv__arg(c, "model"), *scale_s = srv__arg(c, "scale");
    if (s->ts->anonymous && !tenant) tenant = "default";
    if (!tenant || !name) {
        srv_refuse(&err, ADMIT_MISSING_PARAMETER, tenant ? "name" : "tenant",
                   "POST /admin/adapters?tenant=T&name=N with the adapter's GGUF file as the "
                   "body: '%s' is missing",
                   tenant ? "name" : "tenant");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!srv__tenant_known(s, tenant)) {
        srv_fail(&err, 404, "tenant_not_found", "no tenant named '%.64s'", tenant);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    int entry = srv__adapter_entry(s, mname);
    if (entry < 0) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model", "The model '%.200s' does not exist", mname);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    float scale = 1.0f;
    if (scale_s) {
        char *end;
        scale = strtof(scale_s, &end);
        if (end == scale_s || *end || scale == 0.0f) {
            srv_refuse(&err, ADMIT_INVALID, "scale", "'scale' must be a non-zero number, got '%.32s'",
                       scale_s);
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
    }
    if (!q->sc->body.len) {
        srv_refuse(&err, ADMIT_MISSING_PARAMETER, NULL,
                   "the body must be the adapter's GGUF file (llama.cpp's LoRA format)");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    engine_adapter_spec sp = {.tenant = tenant, .name = name,
                              .is_public = srv__truthy(srv__arg(c, "public")), .scale = scale,
                              .data = q->sc->body.p, .len = q->sc->body.len};
    ks_errbuf eb = {0};
    ks_err e = s->b.adapter_add(s->b.impl, entry, &sp, &eb);
    sodium_memzero(q->sc->body.p, q->sc->body.len); // the tenant's fine-tune: not left in a buffer
    if (e) {
        if (e == KS_ERR_NOMEM) srv_fail(&err, 507, "insufficient_storage", "%s", eb.msg);
        else if (e == KS_ERR_UNSUPPORTED) // a backend that takes adapters only at start (router)
            srv_fail(&err, 501, "not_implemented", "%s", eb.msg);
        else if (e == KS_ERR_EXISTS) srv_fail(&err, 409, "adapter_exists", "%s", eb.msg);
        else if (e == KS_ERR_NOSPACE) srv_fail(&err, 507, "insufficient_storage", "%s", eb.msg);
        else srv_refuse(&err, ADMIT_INVALID, NULL, "the adapter was not added: %s", eb.msg);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    ks_log(KS_LOG_WARN, "admin: a LoRA adapter was added for a tenant (%zu bytes%s)",
           q->sc->body.len, sp.is_public ? ", public" : "");
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 201, srv__adapter_find_json(s, entry, tenant, name));
}

/* GET /admin/adapters: every model's adapters. */
static enum MHD_Result srv__adapter_list(server *s, struct MHD_Connection *c) {
    json_t *data = json_array();
    for (int k = 0; k < s->n_mods; k++) {
        int n = s->b.adapter_list(s->b.impl, k, NULL, NULL, 0);
        engine_adapter_info *all = n > 0 ? calloc((size_t)n, sizeof *all) : NULL;
        if (all) n = s->b.adapter_list(s->b.impl, k, NULL, all, n);
        for (int i = 0; all && i < n; i++)
            json_array_append_new(data, srv__adapter_json(s, k, &all[i]));
        free(all);
    }
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200,
                           json_pack("{s:s, s:o}", "object", "list", "data", data));
}

/* DELETE /admin/adapters/{tenant}/{name}[?model=M]. */
static enum MHD_Result srv__adapter_delete(server *s, struct MHD_Connection *c, const char *rest) {
    srv_error err;
    const char *slash = rest ? strchr(rest, '/') : NULL;
    char tenant[128];
    if (!slash || slash == rest || !slash[1] || strchr(slash + 1, '/') ||
        (size_t)(slash - rest) >= sizeof tenant) {
        srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL, "Invalid URL: use DELETE /admin/adapters/{tenant}/{name}");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    snprintf(tenant, sizeof tenant, "%.*s", (int)(slash - rest), rest);
    const char *mname = srv__arg(c, "model");
    int entry = srv__adapter_entry(s, mname);
    if (entry < 0) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model", "The model '%.200s' does not exist", mname);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    ks_errbuf eb = {0};
    if (s->b.adapter_remove(s->b.impl, entry, tenant, slash + 1, &eb)) {
        srv_refuse(&err, ADMIT_ADAPTER_NOT_FOUND, NULL, "tenant '%.64s' has no adapter '%.64s'",
                   tenant, slash + 1);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    ks_log(KS_LOG_WARN, "admin: a LoRA adapter was removed (scrubbed once no request holds it)");
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200,
                           json_pack("{s:s, s:s, s:b}", "tenant", tenant, "name", slash + 1,
                                     "deleted", 1));
}

enum MHD_Result srv__admin_adapters(server *s, struct MHD_Connection *c, const srv_call *q) {
    srv_error err;
    if (!s->b.adapter_add || !s->b.adapter_list || !s->b.adapter_remove) {
        srv_fail(&err, 501, "not_implemented", "this server holds no LoRA adapters");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!strcmp(q->method, "DELETE")) return srv__adapter_delete(s, c, q->rest);
    return !strcmp(q->method, "POST") ? srv__adapter_post(s, c, q) : srv__adapter_list(s, c);
}

void srv__models_adapters(server *s, int entry, int tenant, long long created, json_t *data) {
    if (!s->b.adapter_list || tenant < 0) return;
    const char *who = s->ts->t[tenant].name;
    int n = s->b.adapter_list(s->b.impl, entry, who, NULL, 0);
    engine_adapter_info *all = n > 0 ? calloc((size_t)n, sizeof *all) : NULL;
    if (all) n = s->b.adapter_list(s->b.impl, entry, who, all, n);
    const char *base = srv__model_primary(&s->mods[entry]);
    for (int i = 0; all && i < n; i++) {
        char id[320];
        snprintf(id, sizeof id, "%s:%s", base, all[i].name);
        // vLLM lists its LoRA modules so: the model's id, its "parent" the base
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object",
                                              "model", "created", (json_int_t)created, "owned_by",
                                              all[i].is_public ? "kvseal" : who, "parent", base));
    }
    free(all);
}
