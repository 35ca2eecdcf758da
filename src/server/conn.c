/* conn.c — connection work of the HTTP front: a request's state (its
 * x-request-id, CORS, tenant), authentication, the headers every answer
 * carries, and the replies (JSON bodies and error envelopes). */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Small helpers

/* Copies s into a buffer as valid UTF-8 (each invalid byte -> U+FFFD) and
 * makes a JSON string of it; token pieces can be lone bytes. */
json_t *srv__jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    srv_buf b = {0};
    size_t i = 0;
    bool ok = true;
    while (i < n && ok) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool valid = len && i + len <= n;
        for (size_t k = 1; valid && k < len; k++)
            valid = ((unsigned char)s[i + k] >> 6) == 2;
        if (valid && len > 1) {
            json_t *t = json_stringn(s + i, len); // overlong/surrogate check by jansson
            valid = t != NULL;
            json_decref(t);
        }
        if (valid)
            ok = srv_buf_add(&b, s + i, len), i += len;
        else
            ok = srv_buf_add(&b, "\xEF\xBF\xBD", 3), i++;
    }
    j = ok ? json_stringn(b.p ? b.p : "", b.len) : NULL;
    srv_buf_free(&b);
    return j;
}

const srv_model *srv__model_find(const server *s, const char *name) {
    if (!name) return &s->mods[0];
    for (int k = 0; k < s->n_mods; k++) {
        const srv_model *sm = &s->mods[k];
        if (sm->name && !strcmp(name, sm->name)) return sm;
        for (int i = 0; i < sm->n_aliases; i++)
            if (!strcmp(name, sm->aliases[i])) return sm;
    }
    return NULL;
}

bool srv__truthy(const char *v) {
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

const srv_model *srv__model_split(const server *s, const char *name, const char **adapter) {
    *adapter = NULL;
    const srv_model *sm = srv__model_find(s, name);
    if (sm || !name) return sm;
    // "base:adapter": the longest model name before a colon wins ("a:b:c" tries "a:b" first)
    for (const char *c = strrchr(name, ':'); c; ) {
        size_t n = (size_t)(c - name);
        char base[256];
        if (n > 0 && n < sizeof base && c[1]) {
            memcpy(base, name, n);
            base[n] = 0;
            if ((sm = srv__model_find(s, base))) {
                *adapter = c + 1;
                return sm;
            }
        }
        const char *prev = NULL;
        for (const char *q = name; q < c; q++)
            if (*q == ':') prev = q;
        c = prev;
    }
    return NULL;
}

const char *srv__model_primary(const srv_model *sm) {
    if (sm->n_aliases > 0) return sm->aliases[0];
    return sm->name ? sm->name : "model";
}

const char *srv__primary_name(const server *s) { return srv__model_primary(&s->mods[0]); }

const char *srv__served_names(const server *s, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int k = 0; k < s->n_mods && n < cap; k++) {
        int w = snprintf(buf + n, cap - n, "%s'%s'", k ? ", " : "", srv__model_primary(&s->mods[k]));
        if (w < 0) break;
        n += (size_t)w;
    }
    return buf;
}

/* The request state of c's current request, or NULL (no socket context). */
srv_reqinfo *srv__ri(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    return sk && sk->ri.active ? &sk->ri : NULL;
}

/* Starts the request state of a new request on c: its x-request-id, and
 * whether its Origin may see the answer. */
void srv__ri_begin(server *s, struct MHD_Connection *c, const char *method,
                          const char *url) {
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    if (!sk) return;
    srv_reqinfo *ri = &sk->ri;
    memset(ri, 0, sizeof *ri);
    ri->active = true;
    ri->tenant = -1;
    const char *id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (srv_request_id_ok(id))
        snprintf(ri->rid, sizeof ri->rid, "%s", id);
    else
        srv_request_id_new(ri->rid, sizeof ri->rid);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (s->o.n_cors_origins > 0 &&
        srv_cors_origin_ok(s->o.cors_origins, s->o.n_cors_origins, origin)) {
        bool any = false;
        for (int i = 0; i < s->o.n_cors_origins; i++)
            any = any || !strcmp(s->o.cors_origins[i], "*");
        // "*" answers "*" (no cookies are ever involved); a list echoes the match
        snprintf(ri->origin, sizeof ri->origin, "%s", any ? "*" : origin);
        ri->cors = strlen(origin) < sizeof ri->origin;
    }
    // the path as a log value: a client's bytes never forge a field or a line
    char path[sizeof ri->line - 18]; // room for "%.16s "
    srv_log_value(url ? url : "?", path, sizeof path);
    snprintf(ri->line, sizeof ri->line, "%.16s %s", method ? method : "?", path);
}

/* The headers every answer carries (see the file comment). Counts the
 * answer for its tenant. Only from an MHD callback of c's connection. */
void srv__decorate(server *s, struct MHD_Connection *c, struct MHD_Response *r, int status) {
    srv_reqinfo *ri = srv__ri(c);
    int64_t retry = status == 429 || status == 503 ? 1 : 0;
    if (ri) {
        MHD_add_response_header(r, "x-request-id", ri->rid);
        // with a list of origins the answer depends on Origin: caches must know
        if (s->o.n_cors_origins > 0 && !(ri->cors && !strcmp(ri->origin, "*")))
            MHD_add_response_header(r, "Vary", "Origin");
        if (ri->cors) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", ri->origin);
            MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                    "x-request-id, x-ratelimit-limit-requests, "
                                    "x-ratelimit-remaining-requests, x-ratelimit-reset-requests, "
                                    "x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
                                    "x-ratelimit-reset-tokens, retry-after");
        }
        if (ri->tenant >= 0 && (size_t)ri->tenant < s->ts->n) {
            srv_tenant *t = &s->ts->t[ri->tenant];
            atomic_fetch_add_explicit(&t->m_requests, 1, memory_order_relaxed);
            if (status == 429) atomic_fetch_add_explicit(&t->m_limited, 1, memory_order_relaxed);
            srv_ratelimit rl;
            srv_tenants_ratelimit(s->ts, ri->tenant, ri->need_tokens, ks_now_ns(), &rl);
            char v[64];
            if (rl.requests) {
                snprintf(v, sizeof v, "%lld", (long long)rl.limit_requests);
                MHD_add_response_header(r, "x-ratelimit-limit-requests", v);
                snprintf(v, sizeof v, "%lld", (long long)rl.remaining_requests);
                MHD_add_response_header(r, "x-ratelimit-remaining-requests", v);
                srv_duration_fmt(rl.reset_requests_s, v, sizeof v);
                MHD_add_response_header(r, "x-ratelimit-reset-requests", v);
            }
            if (rl.tokens) {
                snprintf(v, sizeof v, "%lld", (long long)rl.limit_tokens);
                MHD_add_response_header(r, "x-ratelimit-limit-tokens", v);
                snprintf(v, sizeof v, "%lld", (long long)rl.remaining_tokens);
                MHD_add_response_header(r, "x-ratelimit-remaining-tokens", v);
                srv_duration_fmt(rl.reset_tokens_s, v, sizeof v);
                MHD_add_response_header(r, "x-ratelimit-reset-tokens", v);
            }
            // the tenant's own limit: the real refill time of what it lacks
            if (status == 429) retry = srv_retry_after_s(rl.retry_s);
        }
        if (status >= 400) {
            char rid[4 * SRV_REQUEST_ID_MAX + 3];
            srv_log_value(ri->rid, rid, sizeof rid);
            // json: the same fields as a completion's line, where known
            const char *tn =
                ri->tenant >= 0 && (size_t)ri->tenant < s->ts->n ? s->ts->t[ri->tenant].name : NULL;
            json_t *f = json_pack("{s:s, s:s?, s:s, s:i}", "request_id", ri->rid, "tenant", tn,
                                  "request", ri->line, "status", status);
            char *fields = f ? json_dumps(f, JSON_COMPACT) : NULL;
            json_decref(f);
            ks_log_fields(KS_LOG_INFO, fields, "http %d %s request_id=%s", status, ri->line, rid);
            free(fields);
        }
    }
    if (status == 503) { // busy or draining: the queue's expected wait
        engine_stats es;
        s->b.get_stats(s->b.impl, &es);
        unsigned long long n = atomic_load_explicit(&s->met.e2e.n_obs, memory_order_relaxed);
        double mean = n ? (double)atomic_load_explicit(&s->met.e2e.sum_ns, memory_order_relaxed) *
                              1e-9 / (double)n
                        : 0;
        retry = srv_queue_retry_s(mean, es.n_queued, es.n_running);
    }
    if (retry > 0) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)retry);
        MHD_add_response_header(r, "Retry-After", v);
    }
}

enum MHD_Result srv__reply(server *s, struct MHD_Connection *c, srv_route route, int status,
                                  const char *body, const char *ctype) {
    const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}";
    if (!body) body = fallback, status = 500;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    srv__decorate(s, c, r, status);
    if (status == 415)
        MHD_add_response_header(r, "Accept-Encoding", "identity"); // RFC 9110 15.5.16
    if (status == 405) {
        // /admin/kv/check is the one GET among the admin routes
        const char *allow =
            route == SRV_ROUTE_MODELS || route == SRV_ROUTE_HEALTH ||
                    route == SRV_ROUTE_METRICS || route == SRV_ROUTE_UI
                ? "GET"
            : route == SRV_ROUTE_ADMIN ? "GET, POST"
                                       : "POST";
        MHD_add_response_header(r, "Allow", allow);
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_request(&s->met, route, status);
    return ret;
}

enum MHD_Result srv__reply_json(server *s, struct MHD_Connection *c, srv_route route,
                                       int status, json_t *j) {
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    enum MHD_Result r = srv__reply(s, c, route, status, body, "application/json");
    free(body);
    return r;
}

enum MHD_Result srv__reply_error(server *s, struct MHD_Connection *c, srv_route route,
                                        const srv_error *err) {
    if (err->reason != ADMIT_OK) srv_metrics_reject(&s->met, err->reason);
    char *body = srv_error_json(route, err);
    enum MHD_Result r = srv__reply(s, c, route, err->status, body, "application/json");
    free(body);
    return r;
}

/* The bearer token of the request, or NULL. */
const char *srv__bearer(struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return NULL;
    while (*h == ' ')
        h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}

/* Tenant index for an API request, or -1 with err filled (401; 400 when
 * two different keys came). A dialect may name a second header for the key
 * (Anthropic's clients send x-api-key): its routes take it there too;
 * either way the tenant comes from the key alone (I7). */
int srv__auth(server *s, struct MHD_Connection *c, srv_route route, srv_error *err) {
    if (s->ts->anonymous) {
        srv_reqinfo *ri = srv__ri(c);
        if (ri) ri->tenant = 0;
        return 0;
    }
    const srv_dialect_info *d = srv_dialect_get(srv_route_dialect(route));
    const char *key = srv__bearer(c), *xkey = NULL;
    if (d->key_header) xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, d->key_header);
    if (xkey && !*xkey) xkey = NULL;
    if (key && xkey && strcmp(key, xkey) != 0) {
        srv_refuse(err, ADMIT_DUPLICATE_HEADER, NULL,
                   "x-api-key and Authorization carry different keys; send one");
        return -1;
    }
    if (!key) key = xkey;
    if (!key) {
        srv_refuse(err, ADMIT_AUTH, NULL, "%s", d->missing_key);
        return -1;
    }
    int t = srv_tenants_auth(s->ts, key, strlen(key));
    if (t < 0) srv_refuse(err, ADMIT_AUTH, NULL, "invalid API key");
    srv_reqinfo *ri = srv__ri(c);
    if (ri) ri->tenant = t; // its answers carry its x-ratelimit-* headers
    return t;
}

/* True when the request may read /metrics, else false with err filled.
 * Tenant names and traffic are tenant data: with tenants configured only
 * the scraper's key (--metrics-key) or the admin key reads them, as a
 * bearer token (Prometheus' authorization); no key, a tenant's key or a
 * wrong one gets 401, and with neither key configured the route is off
 * (403). Without tenants (one anonymous tenant) it is open. */
bool srv__auth_metrics(server *s, struct MHD_Connection *c, srv_error *err) {
    if (s->ts->anonymous) return true;
    const char *key = srv__bearer(c);
    if (!s->ts->has_metrics && !s->ts->has_admin)
        return srv_refuse(err, ADMIT_ADMIN_DISABLED, NULL,
                          "/metrics is off: with tenants configured it needs a key; start the "
                          "server with --metrics-key (or an admin key) and scrape with "
                          "'Authorization: Bearer <metrics key>'");
    if (!key || !srv_tenants_metrics_ok(s->ts, key, strlen(key)))
        return srv_refuse(err, ADMIT_AUTH, NULL,
                          key ? "invalid metrics key"
                              : "missing metrics key: send 'Authorization: Bearer <metrics key>'");
    return true;
}

/* True when the request carries the admin key, else false with err filled:
 * 403 when no admin key is configured (the admin API is off), 401 for a
 * missing or wrong one. */
bool srv__auth_admin(server *s, struct MHD_Connection *c, srv_error *err) {
    const char *key = srv__bearer(c);
    if (!s->ts->has_admin)
        return srv_refuse(err, ADMIT_ADMIN_DISABLED, NULL,
                          "the admin API is disabled: start the server with --admin-key or an "
                          "admin_key in the tenants file");
    if (!key || !srv_tenants_admin_ok(s->ts, key, strlen(key)))
        return srv_refuse(err, ADMIT_AUTH, NULL,
                          key ? "invalid admin key"
                              : "missing admin key: send 'Authorization: Bearer <admin key>'");
    return true;
}
