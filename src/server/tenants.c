/* tenants.c — tenants, API keys and per-tenant limits.
 *
 * Only SHA-256 hashes of keys are kept (libsodium crypto_hash_sha256); a
 * presented key is hashed once and compared with sodium_memcmp against
 * EVERY stored hash, selecting the match without branching on it, so the
 * time taken says nothing about which tenant (or which key) matched. Keys
 * never appear in logs or error messages. The tenant name a request runs
 * under comes only from here (I7), never from the request body.
 *
 * Limits: a concurrency counter, a token bucket (tokens_per_minute
 * capacity) and a request bucket (requests_per_minute) per tenant, both
 * refilled continuously. Admission reserves prompt + max_tokens and one
 * request; the unused tokens are refunded when the request ends (a request
 * is spent once admitted). srv_tenants_ratelimit reads the buckets for the
 * x-ratelimit-* and Retry-After headers: the wait it reports is the real
 * refill time of what is missing.
 *
 * With srv_tenants_set_redis the two rate buckets live in redis instead,
 * shared by every router of a fleet (limits_redis.c), and the local ones
 * serve only while redis is unreachable, each charge scaled by
 * 1 / local_share so that a process then admits its share of the limit.
 * The concurrency counter is always this process's own. */
#include "server_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Parsing

static void ten__hash(const char *key, size_t len, uint8_t out[32]) {
    crypto_hash_sha256(out, (const unsigned char *)key, len);
}

static srv_tenants *ten__alloc(size_t n) {
    srv_tenants *ts = calloc(1, sizeof *ts);
    if (!ts) return NULL;
    ts->t = calloc(n ? n : 1, sizeof *ts->t);
    if (!ts->t || pthread_mutex_init(&ts->mu, NULL) != 0) {
        free(ts->t);
        free(ts);
        return NULL;
    }
    ts->n = n;
    return ts;
}

srv_tenants *srv_tenants_anonymous(void) {
    srv_tenants *ts = ten__alloc(1);
    if (!ts) return NULL;
    ts->anonymous = true;
    snprintf(ts->t[0].name, sizeof ts->t[0].name, "default");
    snprintf(ts->t[0].cache_domain, sizeof ts->t[0].cache_domain, "tenant:default");
    return ts;
}

void srv_tenants_set_admin(srv_tenants *ts, const char *key) {
    if (!key) return;
    ten__hash(key, strlen(key), ts->admin_hash);
    ts->has_admin = true;
}

void srv_tenants_set_metrics(srv_tenants *ts, const char *key) {
    if (!key) return;
    ten__hash(key, strlen(key), ts->metrics_hash);
    ts->has_metrics = true;
}

ks_err srv_tenants_set_redis(srv_tenants *ts, const char *host, int port, const char *prefix,
                             double local_share, ks_errbuf *eb) {
    if (!(local_share > 0 && local_share <= 1))
        return ks_seterr(eb, KS_ERR_INVAL, "--limits-local-share must be in (0, 1]");
    srv_redis *r = NULL;
    ks_err e = srv_redis_create(host, port, prefix, &r, eb);
    if (e) return e;
    srv_redis_destroy(ts->redis);
    ts->redis = r;
    ts->local_share = local_share;
    atomic_store(&ts->redis_up, true);
    return KS_OK;
}

void srv_tenants_free(srv_tenants *ts) {
    if (!ts) return;
    for (size_t i = 0; i < ts->n; i++) {
        if (ts->t[i].key_hash) sodium_memzero(ts->t[i].key_hash, ts->t[i].n_keys * 32);
        free(ts->t[i].key_hash);
        for (size_t k = 0; k < ts->t[i].n_adapters; k++) {
            free(ts->t[i].adapters[k].path);
            free(ts->t[i].adapters[k].model);
        }
        free(ts->t[i].adapters);
    }
    srv_redis_destroy(ts->redis);
    sodium_memzero(ts->admin_hash, sizeof ts->admin_hash);
    sodium_memzero(ts->metrics_hash, sizeof ts->metrics_hash);
    pthread_mutex_destroy(&ts->mu);
    free(ts->t);
    free(ts);
}

static ks_err ten__limit(json_t *t, const char *key, size_t i, int64_t max, int64_t *out,
                         ks_errbuf *eb) {
    json_t *v = json_object_get(t, key);
    *out = 0;
    if (!v || json_is_null(v)) return KS_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "tenants[%zu].%s must be an integer in [0, %lld] (0: unlimited)", i, key,
                         (long long)max);
    *out = json_integer_value(v);
    return KS_OK;
}

/* A tenant's "adapters": [{"name", "path", "scale"?, "public"?, "model"?}, ...]
 * (loaded at start by srv__load_adapters; here only their shape). */
static ks_err ten__adapters(json_t *t, size_t i, srv_tenant *tt, ks_errbuf *eb) {
    json_t *arr = json_object_get(t, "adapters");
    if (!arr || json_is_null(arr)) return KS_OK;
    if (!json_is_array(arr))
        return ks_seterr(eb, KS_ERR_FORMAT, "tenants[%zu] (\"%s\"): \"adapters\" must be an array",
                         i, tt->name);
    size_t n = json_array_size(arr);
    if (n > ENGINE_ADAPTERS_MAX)
        return ks_seterr(eb, KS_ERR_FORMAT, "tenants[%zu] (\"%s\"): more than %d adapters", i,
                         tt->name, ENGINE_ADAPTERS_MAX);
    if (n && !(tt->adapters = calloc(n, sizeof *tt->adapters)))
        return ks_seterr(eb, KS_ERR_NOMEM, "tenants file: out of memory");
    for (size_t k = 0; k < n; k++) {
        json_t *a = json_array_get(arr, k), *v;
        srv_tenant_adapter *ta = &tt->adapters[tt->n_adapters++];
        const char *key;
        json_object_foreach(json_is_object(a) ? a : NULL, key, v) {
            if (strcmp(key, "name") && strcmp(key, "path") && strcmp(key, "scale") &&
                strcmp(key, "public") && strcmp(key, "model"))
                return ks_seterr(eb, KS_ERR_FORMAT,
                                 "tenants[%zu] (\"%s\").adapters[%zu]: unknown key \"%.64s\" "
                                 "(name, path, scale, public, model)",
                                 i, tt->name, k, key);
        }
        json_t *name = json_object_get(a, "name"), *path = json_object_get(a, "path");
        if (!json_is_object(a) || !json_is_string(name) || !json_is_string(path) ||
            json_string_length(name) == 0 || json_string_length(name) >= sizeof ta->name ||
            json_string_length(path) == 0)
            return ks_seterr(eb, KS_ERR_FORMAT,
                             "tenants[%zu] (\"%s\").adapters[%zu]: needs \"name\" (1-%zu bytes) "
                             "and \"path\" strings",
                             i, tt->name, k, sizeof ta->name - 1);
        snprintf(ta->name, sizeof ta->name, "%s", json_string_value(name));
        for (size_t j = 0; j < k; j++)
            if (!strcmp(tt->adapters[j].name, ta->name))
                return ks_seterr(eb, KS_ERR_FORMAT,
                                 "tenants[%zu] (\"%s\"): two adapters named \"%s\"", i, tt->name,
                                 ta->name);
        if (!(ta->path = strdup(json_string_value(path))))
            return ks_seterr(eb, KS_ERR_NOMEM, "tenants file: out of memory");
        if ((v = json_object_get(a, "scale")) && !json_is_null(v)) {
            if (!json_is_number(v))
                return ks_seterr(eb, KS_ERR_FORMAT,
                                 "tenants[%zu] (\"%s\").adapters[%zu]: \"scale\" must be a number",
                                 i, tt->name, k);
            ta->scale = (float)json_number_value(v);
        }
        if ((v = json_object_get(a, "public")) && !json_is_null(v)) {
            if (!json_is_boolean(v))
                return ks_seterr(eb, KS_ERR_FORMAT,
                                 "tenants[%zu] (\"%s\").adapters[%zu]: \"public\" must be true "
                                 "or false",
                                 i, tt->name, k);
            ta->is_public = json_is_true(v);
        }
        if ((v = json_object_get(a, "model")) && !json_is_null(v)) {
            if (!json_is_string(v))
                return ks_seterr(eb, KS_ERR_FORMAT,
                                 "tenants[%zu] (\"%s\").adapters[%zu]: \"model\" must be a "
                                 "model's name",
                                 i, tt->name, k);
            if (!(ta->model = strdup(json_string_value(v))))
                return ks_seterr(eb, KS_ERR_NOMEM, "tenants file: out of memory");
        }
    }
    return KS_OK;
}

ks_err srv_tenants_parse(const char *text, size_t len, srv_tenants **out, ks_errbuf *eb) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "tenants file: malformed JSON at line %d, column %d: %s", je.line,
                         je.column, je.text);
    srv_tenants *ts = NULL;
    ks_err e = KS_OK;
    json_t *arr = json_object_get(root, "tenants");
    if (!json_is_object(root) || !json_is_array(arr) || json_array_size(arr) == 0) {
        e = ks_seterr(eb, KS_ERR_FORMAT,
                      "tenants file: expected {\"tenants\": [...]} with at "
                      "least one tenant");
        goto fail;
    }
    size_t n = json_array_size(arr);
    if (!(ts = ten__alloc(n))) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "tenants file: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        json_t *name = json_object_get(t, "name"), *keys = json_object_get(t, "keys");
        if (!json_is_object(t) || !json_is_string(name) || json_string_length(name) == 0 ||
            json_string_length(name) >= sizeof ts->t[i].name) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants[%zu]: needs a \"name\" string of 1 to %zu bytes", i,
                          sizeof ts->t[i].name - 1);
            goto fail;
        }
        srv_tenant *tt = &ts->t[i];
        snprintf(tt->name, sizeof tt->name, "%s", json_string_value(name));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(ts->t[j].name, tt->name)) {
                e = ks_seterr(eb, KS_ERR_FORMAT, "tenants[%zu]: duplicate name \"%s\"", i,
                              tt->name);
                goto fail;
            }
        if (!json_is_array(keys) || json_array_size(keys) == 0) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants[%zu] (\"%s\"): needs a non-empty \"keys\" array", i, tt->name);
            goto fail;
        }
        tt->n_keys = json_array_size(keys);
        if (!(tt->key_hash = calloc(tt->n_keys, 32))) {
            e = ks_seterr(eb, KS_ERR_NOMEM, "tenants file: out of memory");
            goto fail;
        }
        for (size_t k = 0; k < tt->n_keys; k++) {
            json_t *key = json_array_get(keys, k);
            if (!json_is_string(key) || json_string_length(key) == 0) {
                e = ks_seterr(eb, KS_ERR_FORMAT,
                              "tenants[%zu] (\"%s\"): keys[%zu] must be a non-empty string", i,
                              tt->name, k);
                goto fail;
            }
            ten__hash(json_string_value(key), json_string_length(key), tt->key_hash[k]);
        }
        // I7: tenants share cached prefixes only when the operator puts them
        // in the same named group; the domain never comes from a request
        json_t *grp = json_object_get(t, "prefix_share");
        if (grp && !json_is_null(grp)) {
            if (!json_is_string(grp) || json_string_length(grp) == 0 || json_string_length(grp) > 63) {
                e = ks_seterr(eb, KS_ERR_FORMAT,
                              "tenants[%zu] (\"%s\"): \"prefix_share\" must be a group name (1-63 bytes)",
                              i, tt->name);
                goto fail;
            }
            snprintf(tt->cache_domain, sizeof tt->cache_domain, "share:%s", json_string_value(grp));
        } else {
            snprintf(tt->cache_domain, sizeof tt->cache_domain, "tenant:%s", tt->name);
        }
        if ((e = ten__adapters(t, i, tt, eb))) goto fail;
        int64_t v;
        if ((e = ten__limit(t, "max_concurrent", i, INT32_MAX, &v, eb))) goto fail;
        tt->max_concurrent = (int32_t)v;
        if ((e = ten__limit(t, "tokens_per_minute", i, INT64_C(1) << 50, &v, eb))) goto fail;
        tt->tokens_per_minute = v;
        tt->bucket = (double)v;
        if ((e = ten__limit(t, "requests_per_minute", i, INT64_C(1) << 40, &v, eb))) goto fail;
        tt->requests_per_minute = v;
        tt->rbucket = (double)v;
    }
    // a key shared by two tenants would make the tenant ambiguous: refuse it
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < ts->t[i].n_keys; k++)
            for (size_t j = i; j < n; j++)
                for (size_t l = (j == i ? k + 1 : 0); l < ts->t[j].n_keys; l++)
                    if (!memcmp(ts->t[i].key_hash[k], ts->t[j].key_hash[l], 32)) {
                        e = ks_seterr(eb, KS_ERR_FORMAT,
                                      "tenants file: tenants[%zu] keys[%zu] and tenants[%zu] "
                                      "keys[%zu] are the same key",
                                      i, k, j, l);
                        goto fail;
                    }
    json_t *admin = json_object_get(root, "admin_key");
    if (admin && !json_is_null(admin)) {
        if (!json_is_string(admin) || json_string_length(admin) == 0) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants file: \"admin_key\" must be a non-empty string");
            goto fail;
        }
        if (json_string_length(admin) < SERVER_KEY_MIN_BYTES) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants file: \"admin_key\" has %zu bytes; at least %d are needed",
                          json_string_length(admin), SERVER_KEY_MIN_BYTES);
            goto fail;
        }
        srv_tenants_set_admin(ts, json_string_value(admin));
    }
    json_t *mk = json_object_get(root, "metrics_key");
    if (mk && !json_is_null(mk)) {
        if (!json_is_string(mk) || json_string_length(mk) == 0) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants file: \"metrics_key\" must be a non-empty string");
            goto fail;
        }
        if (json_string_length(mk) < SERVER_KEY_MIN_BYTES) {
            e = ks_seterr(eb, KS_ERR_FORMAT,
                          "tenants file: \"metrics_key\" has %zu bytes; at least %d are needed",
                          json_string_length(mk), SERVER_KEY_MIN_BYTES);
            goto fail;
        }
        srv_tenants_set_metrics(ts, json_string_value(mk));
    }
    json_t *lc = json_object_get(root, "log_content");
    if (lc && !json_is_null(lc)) {
        if (!json_is_boolean(lc)) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "tenants file: \"log_content\" must be a boolean");
            goto fail;
        }
        ts->log_content = json_is_true(lc);
    }
    json_decref(root);
    *out = ts;
    return KS_OK;
fail:
    srv_tenants_free(ts);
    json_decref(root);
    return e;
}

// ----------------------------------------------------------------------------
// Authentication

int srv_tenants_auth(const srv_tenants *ts, const char *key, size_t len) {
    if (ts->anonymous) return 0;
    uint8_t h[32];
    ten__hash(key, len, h);
    // branch-free selection: every hash is compared, the match is masked in
    uint32_t found = 0, idx = 0;
    for (size_t i = 0; i < ts->n; i++)
        for (size_t k = 0; k < ts->t[i].n_keys; k++) {
            uint32_t eq = (uint32_t)(sodium_memcmp(h, ts->t[i].key_hash[k], 32) == 0);
            uint32_t mask = 0u - eq;
            idx = (idx & ~mask) | ((uint32_t)i & mask);
            found |= eq;
        }
    sodium_memzero(h, sizeof h);
    return found ? (int)idx : -1;
}

bool srv_tenants_admin_ok(const srv_tenants *ts, const char *key, size_t len) {
    uint8_t h[32];
    ten__hash(key, len, h);
    bool ok = sodium_memcmp(h, ts->admin_hash, 32) == 0;
    sodium_memzero(h, sizeof h);
    return ts->has_admin && ok;
}

bool srv_tenants_metrics_ok(const srv_tenants *ts, const char *key, size_t len) {
    uint8_t h[32];
    ten__hash(key, len, h);
    // both compared, whichever matches: the time says nothing about which
    bool m = sodium_memcmp(h, ts->metrics_hash, 32) == 0;
    bool a = sodium_memcmp(h, ts->admin_hash, 32) == 0;
    sodium_memzero(h, sizeof h);
    return (ts->has_metrics && m) | (ts->has_admin && a);
}

// ----------------------------------------------------------------------------
// Limits

/* Tenant t's shared buckets (redis): takes (force: adds the negated) dt
 * tokens and dr requests, filling st. false when there are none or redis is
 * unreachable: the caller uses the local buckets. Under ts->mu. */
static bool ten__shared(srv_tenants *ts, const srv_tenant *t, bool force, int64_t dt, int64_t dr,
                        srv_redis_state *st) {
    if (!ts->redis || (!t->tokens_per_minute && !t->requests_per_minute)) return false;
    if (srv_redis_bucket(ts->redis, t->name, t->tokens_per_minute, t->requests_per_minute, force,
                         dt, dr, st) == KS_OK) {
        atomic_store(&ts->redis_up, true);
        return true;
    }
    atomic_fetch_add(&ts->m_redis_errors, 1);
    atomic_store(&ts->redis_up, false);
    return false;
}

/* A local charge of x: scaled up by 1 / local_share when the local buckets
 * stand in for redis's (they then hold this process's share). */
static double ten__local(const srv_tenants *ts, double x) {
    return ts->redis ? x / ts->local_share : x;
}

static void ten__refill(srv_tenant *t, uint64_t now_ns) {
    if (!t->tokens_per_minute && !t->requests_per_minute) return;
    if (t->bucket_ns == 0) t->bucket_ns = now_ns;
    if (now_ns > t->bucket_ns) {
        double dt_min = (double)(now_ns - t->bucket_ns) * 1e-9 / 60.0;
        if (t->tokens_per_minute) {
            t->bucket += dt_min * (double)t->tokens_per_minute;
            if (t->bucket > (double)t->tokens_per_minute) t->bucket = (double)t->tokens_per_minute;
        }
        if (t->requests_per_minute) {
            t->rbucket += dt_min * (double)t->requests_per_minute;
            if (t->rbucket > (double)t->requests_per_minute)
                t->rbucket = (double)t->requests_per_minute;
        }
    }
    t->bucket_ns = now_ns;
}

/* The 429 message of a request of `tokens` (a lower bound when at_least)
 * that the tenant's bucket cannot pay now, with `avail` tokens in it. */
static void ten__rate_msg(const srv_tenant *t, int64_t tokens, bool at_least, double avail,
                          char *msg, size_t cap) {
    const char *least = at_least ? "at least " : "";
    if (tokens <= 0) // a request that reserves none (tokenize): earlier ones left a debt
        snprintf(msg, cap,
                 "tenant '%s' exceeded its limit of %lld tokens per minute (%lld available "
                 "now); retry later",
                 t->name, (long long)t->tokens_per_minute, (long long)floor(avail));
    else if (tokens > t->tokens_per_minute)
        snprintf(msg, cap,
                 "request needs %s%lld tokens (prompt + max_tokens), more than tenant '%s''s "
                 "limit of %lld tokens per minute; lower max_tokens",
                 least, (long long)tokens, t->name, (long long)t->tokens_per_minute);
    else
        snprintf(msg, cap,
                 "tenant '%s' exceeded its limit of %lld tokens per minute (request needs "
                 "%s%lld, %lld available now); retry later",
                 t->name, (long long)t->tokens_per_minute, least, (long long)tokens,
                 (long long)avail);
}

admit_reason srv_tenants_admit(srv_tenants *ts, int i, int64_t tokens, uint64_t now_ns, char *msg,
                               size_t cap) {
    return srv_tenants_admit_n(ts, i, 1, tokens, now_ns, msg, cap);
}

admit_reason srv_tenants_admit_n(srv_tenants *ts, int i, int slots, int64_t tokens, uint64_t now_ns,
                                 char *msg, size_t cap) {
    KS_ASSERT(i >= 0 && (size_t)i < ts->n);
    if (slots < 1) slots = 1;
    srv_tenant *t = &ts->t[i];
    admit_reason r = ADMIT_OK;
    srv_redis_state st;
    pthread_mutex_lock(&ts->mu);
    if (t->bucket_ns == 0) t->bucket_ns = now_ns;
    ten__refill(t, now_ns);
    if (t->max_concurrent && slots > t->max_concurrent) {
        // every choice runs as a sequence of its own: n of them are n requests
        snprintf(msg, cap,
                 "%d choices (n / best_of) take %d of tenant '%s''s concurrent requests, and its "
                 "limit is %d; lower n",
                 slots, slots, t->name, t->max_concurrent);
        r = ADMIT_TENANT_CONCURRENCY;
    } else if (t->max_concurrent && t->running + slots > t->max_concurrent) {
        snprintf(msg, cap,
                 "tenant '%s' already has %d requests running (limit %d)%s; retry later", t->name,
                 t->running, t->max_concurrent, slots > 1 ? ", and each choice counts as one" : "");
        r = ADMIT_TENANT_CONCURRENCY;
    } else if (ten__shared(ts, t, false, tokens, 1, &st)) {
        if (st.taken) {
            t->running += slots;
        } else if (t->requests_per_minute && st.requests < 1.0) {
            snprintf(msg, cap,
                     "tenant '%s' exceeded its limit of %lld requests per minute; retry later",
                     t->name, (long long)t->requests_per_minute);
            r = ADMIT_TENANT_RATE;
        } else {
            ten__rate_msg(t, tokens, true, st.tokens, msg, cap);
            r = ADMIT_TENANT_RATE;
        }
    } else if (t->requests_per_minute && t->rbucket < ten__local(ts, 1.0)) {
        snprintf(msg, cap,
                 "tenant '%s' exceeded its limit of %lld requests per minute; retry later", t->name,
                 (long long)t->requests_per_minute);
        r = ADMIT_TENANT_RATE;
    } else if (t->tokens_per_minute && ten__local(ts, (double)tokens) > t->bucket) {
        ten__rate_msg(t, tokens, true, t->bucket / ten__local(ts, 1.0), msg, cap);
        r = ADMIT_TENANT_RATE;
    } else {
        t->running += slots;
        if (t->tokens_per_minute) t->bucket -= ten__local(ts, (double)tokens);
        if (t->requests_per_minute) t->rbucket -= ten__local(ts, 1.0);
    }
    pthread_mutex_unlock(&ts->mu);
    return r;
}

void srv_tenants_release(srv_tenants *ts, int i, int64_t unused) {
    srv_tenants_release_n(ts, i, 1, unused);
}

void srv_tenants_release_n(srv_tenants *ts, int i, int slots, int64_t unused) {
    KS_ASSERT(i >= 0 && (size_t)i < ts->n);
    srv_tenant *t = &ts->t[i];
    if (slots < 1) slots = 1;
    pthread_mutex_lock(&ts->mu);
    KS_ASSERT(t->running >= slots);
    t->running -= slots;
    srv_redis_state st;
    if (t->tokens_per_minute && unused > 0 && !ten__shared(ts, t, true, -unused, 0, &st)) {
        t->bucket += ten__local(ts, (double)unused);
        if (t->bucket > (double)t->tokens_per_minute) t->bucket = (double)t->tokens_per_minute;
    }
    pthread_mutex_unlock(&ts->mu);
}

admit_reason srv_tenants_grow(srv_tenants *ts, int i, int64_t reserved, int64_t tokens,
                              uint64_t now_ns, char *msg, size_t cap) {
    KS_ASSERT(i >= 0 && (size_t)i < ts->n);
    srv_tenant *t = &ts->t[i];
    admit_reason r = ADMIT_OK;
    int64_t more = tokens - reserved;
    if (more <= 0 || !t->tokens_per_minute) return r;
    srv_redis_state st;
    pthread_mutex_lock(&ts->mu);
    ten__refill(t, now_ns);
    if (ten__shared(ts, t, false, more, 0, &st)) {
        if (!st.taken) {
            ten__rate_msg(t, tokens, false, st.tokens + (double)reserved, msg, cap);
            r = ADMIT_TENANT_RATE;
        }
    } else if (ten__local(ts, (double)more) > t->bucket) {
        // the numbers the client sees are the whole request's, as in srv_tenants_admit
        ten__rate_msg(t, tokens, false, t->bucket / ten__local(ts, 1.0) + (double)reserved, msg,
                      cap);
        r = ADMIT_TENANT_RATE;
    } else {
        t->bucket -= ten__local(ts, (double)more);
    }
    pthread_mutex_unlock(&ts->mu);
    return r;
}

void srv_tenants_refuse(srv_tenants *ts, int i, int64_t reserved, int64_t charged) {
    srv_tenants_refuse_n(ts, i, 1, reserved, charged);
}

void srv_tenants_refuse_n(srv_tenants *ts, int i, int slots, int64_t reserved, int64_t charged) {
    KS_ASSERT(i >= 0 && (size_t)i < ts->n);
    srv_tenant *t = &ts->t[i];
    if (slots < 1) slots = 1;
    pthread_mutex_lock(&ts->mu);
    KS_ASSERT(t->running >= slots);
    t->running -= slots;
    srv_redis_state st;
    if (t->tokens_per_minute && !ten__shared(ts, t, true, charged - reserved, 0, &st)) {
        // a debt (charged > reserved) leaves the bucket below zero: the
        // tenant's next requests wait until refilling has paid it off
        t->bucket += ten__local(ts, (double)(reserved - charged));
        if (t->bucket > (double)t->tokens_per_minute) t->bucket = (double)t->tokens_per_minute;
    }
    pthread_mutex_unlock(&ts->mu);
}

// ----------------------------------------------------------------------------
// Rate-limit headers

/* Seconds until a bucket of `cap` refilled at cap per minute holds `want`
 * (from `have`); 0 when it already does. */
static double ten__wait(double have, double want, int64_t cap) {
    if (cap <= 0 || have >= want) return 0;
    return (want - have) * 60.0 / (double)cap;
}

void srv_tenants_ratelimit(srv_tenants *ts, int i, int64_t tokens, uint64_t now_ns,
                           srv_ratelimit *out) {
    KS_ASSERT(i >= 0 && (size_t)i < ts->n);
    srv_tenant *t = &ts->t[i];
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&ts->mu);
    ten__refill(t, now_ns);
    // what the headers show: the shared buckets, else the local ones in
    // units of the whole limit
    double rbucket = t->rbucket / ten__local(ts, 1.0), bucket = t->bucket / ten__local(ts, 1.0);
    srv_redis_state st;
    if (ten__shared(ts, t, true, 0, 0, &st)) rbucket = st.requests, bucket = st.tokens;
    if (t->requests_per_minute) {
        double cap = (double)t->requests_per_minute;
        out->requests = true;
        out->limit_requests = t->requests_per_minute;
        out->remaining_requests = rbucket > 0 ? (int64_t)rbucket : 0;
        out->reset_requests_s = ten__wait(rbucket, cap, t->requests_per_minute);
        double w = ten__wait(rbucket, 1.0, t->requests_per_minute);
        if (w > out->retry_s) out->retry_s = w;
    }
    if (t->tokens_per_minute) {
        double cap = (double)t->tokens_per_minute;
        out->tokens = true;
        out->limit_tokens = t->tokens_per_minute;
        out->remaining_tokens = bucket > 0 ? (int64_t)bucket : 0;
        out->reset_tokens_s = ten__wait(bucket, cap, t->tokens_per_minute);
        // larger than the limit: it never passes; the honest hint is "when full"
        double want = (double)tokens > cap ? cap : (double)tokens;
        double w = ten__wait(bucket, want, t->tokens_per_minute);
        if (w > out->retry_s) out->retry_s = w;
    }
    pthread_mutex_unlock(&ts->mu);
}

int64_t srv_retry_after_s(double s) {
    if (!(s > 1.0)) return 1; // NaN, negative, zero, sub-second: 1
    if (s > 1e9) return 1000000000;
    double c = ceil(s - 1e-9); // 60.0000000001 from float noise stays 60
    return c < 1 ? 1 : (int64_t)c;
}

size_t srv_duration_fmt(double s, char *buf, size_t cap) {
    if (!cap) return 0;
    if (!(s > 0)) s = 0;
    if (s > 1e9) s = 1e9;
    uint64_t ms = (uint64_t)ceil(s * 1000.0 - 1e-6);
    int n;
    if (ms < 1000) {
        n = snprintf(buf, cap, "%llums", (unsigned long long)ms);
    } else {
        uint64_t h = ms / 3600000, m = ms / 60000 % 60, sec = ms / 1000 % 60, frac = ms % 1000;
        char secs[32];
        if (frac) {
            snprintf(secs, sizeof secs, "%llu.%03llu", (unsigned long long)sec,
                     (unsigned long long)frac);
            size_t k = strlen(secs);
            while (secs[k - 1] == '0')
                secs[--k] = '\0';
        } else {
            snprintf(secs, sizeof secs, "%llu", (unsigned long long)sec);
        }
        if (h)
            n = snprintf(buf, cap, "%lluh%llum%ss", (unsigned long long)h, (unsigned long long)m,
                         secs);
        else if (m)
            n = snprintf(buf, cap, "%llum%ss", (unsigned long long)m, secs);
        else
            n = snprintf(buf, cap, "%ss", secs);
    }
    if (n < 0) n = 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}
