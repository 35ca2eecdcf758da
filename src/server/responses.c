/* responses.c — OpenAI's Responses API translated onto the chat machinery
 * (responses.h). A request becomes the chat request it means and goes
 * through the same validation, chat template, tool-call grammar and parser
 * as /v1/chat/completions; only the edges differ: input items instead of
 * messages, output items and typed SSE events instead of choices, and a
 * store of finished responses, per tenant, that previous_response_id
 * continues.
 *
 * Fields follow OpenAI's Responses reference (the openai SDK's types).
 * What kvseal cannot honour is refused by name (images, files, hosted
 * tools, background, truncation "auto"), never silently dropped. The store
 * is the only state: its entries are JSON text, wiped (sodium_memzero) when
 * deleted, expired or evicted. */
#include "responses.h"

#include "http_int.h" /* srv__jstr: token pieces as JSON strings */
#include "server_int.h"

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)
#define UNSUPPORTED(err, param, ...)                                                               \
    srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, param, __VA_ARGS__)
#define OOM(err) srv_fail(err, 500, "internal_error", "out of memory")

// ----------------------------------------------------------------------------
// The store

typedef struct resp__entry {
    struct resp__entry *next; /* newer entries follow */
    char tenant[64];
    char id[64];
    uint64_t t_ns; /* when it was stored */
    char *resp;    /* the response object's JSON (malloc'd) */
    size_t resp_len;
    char *conv; /* the conversation items' JSON (malloc'd) */
    size_t conv_len;
} resp__entry;

struct srv_resp_store {
    pthread_mutex_t mu;
    resp__entry *head; /* oldest first */
    size_t max_count, max_bytes;
    uint64_t ttl_ns;
};

srv_resp_store *srv_resp_store_create(size_t max_count, size_t max_bytes, uint64_t ttl_s) {
    srv_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->max_count = max_count;
    st->max_bytes = max_bytes;
    st->ttl_ns = ttl_s * 1000000000ull;
    return st;
}

/* Wipes an entry's text and frees it. */
static void resp__entry_free(resp__entry *e) {
    if (!e) return;
    if (e->resp) sodium_memzero(e->resp, e->resp_len);
    if (e->conv) sodium_memzero(e->conv, e->conv_len);
    free(e->resp);
    free(e->conv);
    sodium_memzero(e, sizeof *e);
    free(e);
}

void srv_resp_store_destroy(srv_resp_store *st) {
    if (!st) return;
    for (resp__entry *e = st->head, *n; e; e = n) {
        n = e->next;
        resp__entry_free(e);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static size_t resp__bytes(const resp__entry *e) { return e->resp_len + e->conv_len; }

/* Removes every expired entry (any tenant's). Under st->mu. */
static void resp__expire(srv_resp_store *st, uint64_t now_ns) {
    for (resp__entry **pp = &st->head; *pp;) {
        resp__entry *e = *pp;
        if (st->ttl_ns && now_ns - e->t_ns >= st->ttl_ns) {
            *pp = e->next;
            resp__entry_free(e);
        } else {
            pp = &e->next;
        }
    }
}

/* Tenant's count and bytes. Under st->mu, after resp__expire. */
static void resp__count(srv_resp_store *st, const char *tenant, size_t *n, size_t *bytes) {
    *n = *bytes = 0;
    for (resp__entry *e = st->head; e; e = e->next)
        if (!strcmp(e->tenant, tenant)) (*n)++, *bytes += resp__bytes(e);
}

ks_err srv_resp_store_put(srv_resp_store *st, const char *tenant, const char *id,
                          const json_t *resp, const json_t *conv, uint64_t now_ns) {
    resp__entry *e = calloc(1, sizeof *e);
    if (!e) return KS_ERR_NOMEM;
    snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
    snprintf(e->id, sizeof e->id, "%s", id);
    e->t_ns = now_ns;
    e->resp = json_dumps(resp, JSON_COMPACT);
    e->conv = json_dumps(conv, JSON_COMPACT);
    if (!e->resp || !e->conv) {
        resp__entry_free(e);
        return KS_ERR_NOMEM;
    }
    e->resp_len = strlen(e->resp);
    e->conv_len = strlen(e->conv);
    if (resp__bytes(e) > st->max_bytes || !st->max_count) {
        resp__entry_free(e);
        return KS_ERR_NOSPACE;
    }
    pthread_mutex_lock(&st->mu);
    resp__expire(st, now_ns);
    size_t n, bytes;
    resp__count(st, tenant, &n, &bytes);
    // the tenant's oldest go first until the new one fits its bounds
    for (resp__entry **pp = &st->head;
         *pp && (n + 1 > st->max_count || bytes + resp__bytes(e) > st->max_bytes);) {
        resp__entry *o = *pp;
        if (strcmp(o->tenant, tenant) != 0) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        n--, bytes -= resp__bytes(o);
        resp__entry_free(o);
    }
    resp__entry **tail = &st->head;
    while (*tail)
        tail = &(*tail)->next;
    *tail = e;
    pthread_mutex_unlock(&st->mu);
    return KS_OK;
}

/* Tenant's entry id, or NULL. Under st->mu, after resp__expire. */
static resp__entry **resp__find(srv_resp_store *st, const char *tenant, const char *id) {
    for (resp__entry **pp = &st->head; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->id, id) && !strcmp((*pp)->tenant, tenant)) return pp;
    return NULL;
}

json_t *srv_resp_store_get(srv_resp_store *st, const char *tenant, const char *id, bool conv,
                           uint64_t now_ns) {
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    resp__expire(st, now_ns);
    resp__entry **pp = resp__find(st, tenant, id);
    json_t *j = NULL;
    if (pp)
        j = conv ? json_loadb((*pp)->conv, (*pp)->conv_len, 0, NULL)
                 : json_loadb((*pp)->resp, (*pp)->resp_len, 0, NULL);
    pthread_mutex_unlock(&st->mu);
    return j;
}

bool srv_resp_store_delete(srv_resp_store *st, const char *tenant, const char *id,
                           uint64_t now_ns) {
    if (!st) return false;
    pthread_mutex_lock(&st->mu);
    resp__expire(st, now_ns);
    resp__entry **pp = resp__find(st, tenant, id);
    if (pp) {
        resp__entry *e = *pp;
        *pp = e->next;
        resp__entry_free(e);
    }
    pthread_mutex_unlock(&st->mu);
    return pp != NULL;
}

void srv_resp_store_usage(srv_resp_store *st, const char *tenant, uint64_t now_ns, size_t *n,
                          size_t *bytes) {
    *n = *bytes = 0;
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    resp__expire(st, now_ns);
    resp__count(st, tenant, n, bytes);
    pthread_mutex_unlock(&st->mu);
}

// ----------------------------------------------------------------------------
// Requests

static bool resp__in(const char *const *set, const char *s) {
    for (; *set; set++)
        if (!strcmp(*set, s)) return true;
    return false;
}

/* The request fields this route implements (docs/responses.md). */
static const char *const resp__fields[] = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "store",
    "metadata",
    "user",
    "previous_response_id",
    "reasoning",
    "include",
    "truncation",
    "prompt_cache_key",
    "service_tier",
    NULL,
};

/* Refuses a key of object o outside keys (pname names o). */
static bool resp__keys(json_t *o, const char *const *keys, const char *pname, srv_error *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (resp__in(keys, k)) continue;
        return UNSUPPORTED(err, pname, "Unsupported parameter: '%s.%.40s' is not supported", pname,
                           k);
    }
    return true;
}

/* A conversion's state: the chat messages and the reasoning waiting for
 * the next assistant turn. */
typedef struct resp__conv {
    json_t *msgs;      /* chat messages */
    json_t *reasoning; /* a JSON string, or NULL */
    size_t n_parts;
} resp__conv;

/* Appends m (stolen) to the messages, giving an assistant turn the waiting
 * reasoning. False on out-of-memory. */
static bool resp__push(resp__conv *cv, json_t *m) {
    if (!m) return false;
    const char *role = json_string_value(json_object_get(m, "role"));
    if (role && !strcmp(role, "assistant") && cv->reasoning) {
        json_object_set_new(m, "reasoning_content", cv->reasoning);
        cv->reasoning = NULL;
    }
    return !json_array_append_new(cv->msgs, m);
}

/* A message item's content (a string, or input_text/output_text parts) as
 * chat content (a string, or text parts); NULL with err filled. */
static json_t *resp__content(json_t *c, const char *pname, resp__conv *cv, srv_error *err) {
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) {
        INVALID(err, pname, "%s: must be a string or an array of content parts, got %s", pname,
                srv_json_kind(c));
        return NULL;
    }
    cv->n_parts += json_array_size(c);
    if (cv->n_parts > SRV_MAX_CONTENT_PARTS) {
        INVALID(err, pname, "%s: the request has more than %d content parts", pname,
                SRV_MAX_CONTENT_PARTS);
        return NULL;
    }
    json_t *parts = json_array();
    size_t k;
    json_t *p;
    char pn[96];
    json_array_foreach(c, k, p) {
        snprintf(pn, sizeof pn, "%.60s[%zu]", pname, k);
        json_t *t = json_object_get(p, "type");
        if (!json_is_object(p) || !json_is_string(t)) {
            INVALID(err, pn, "%s: must be an object with a string 'type'", pn);
            goto fail;
        }
        const char *type = json_string_value(t);
        if (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0) {
            UNSUPPORTED(err, pn,
                        "%s.type: '%.32s' content is not supported: only input_text "
                        "and output_text",
                        pn, type);
            goto fail;
        }
        static const char *const keys[] = {"type", "text", "annotations", "logprobs", NULL};
        if (!resp__keys(p, keys, pn, err)) goto fail;
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) {
            INVALID(err, pn, "%s.text: must be a string", pn);
            goto fail;
        }
        if (json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text))) {
            OOM(err);
            goto fail;
        }
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* The text of a reasoning item (its content's reasoning_text, else its
 * summary's summary_text, joined), a new JSON string or NULL when empty. */
static json_t *resp__reasoning_text(json_t *item) {
    json_t *arr = json_object_get(item, "content");
    if (!json_is_array(arr) || !json_array_size(arr)) arr = json_object_get(item, "summary");
    srv_buf b = {0};
    size_t k;
    json_t *p;
    bool ok = true;
    json_array_foreach(arr, k, p) {
        json_t *t = json_object_get(p, "text");
        if (!json_is_string(t)) continue;
        if (b.len) ok = ok && srv_buf_add(&b, "\n", 1);
        ok = ok && srv_buf_add(&b, json_string_value(t), json_string_length(t));
    }
    json_t *s = ok && b.len ? json_stringn(b.p, b.len) : NULL;
    srv_buf_free(&b);
    return s;
}

/* One input item (index i of the input, or of the previous response's
 * items when prev) into the chat messages. */
static bool resp__item(resp__conv *cv, json_t *it, const char *pname, srv_error *err) {
    if (!json_is_object(it))
        return INVALID(err, pname, "%s: must be an object, got %s", pname, srv_json_kind(it));
    json_t *tv = json_object_get(it, "type");
    if (tv && !json_is_string(tv)) return INVALID(err, pname, "%s.type: must be a string", pname);
    const char *type = tv ? json_string_value(tv) : "message";
    char pn[96];
    if (!strcmp(type, "message")) {
        static const char *const keys[] = {"type", "role", "content", "id", "status", NULL};
        if (!resp__keys(it, keys, pname, err)) return false;
        json_t *role = json_object_get(it, "role");
        const char *r = json_string_value(role);
        static const char *const roles[] = {"user", "system", "developer", "assistant", NULL};
        if (!r || !resp__in(roles, r)) {
            snprintf(pn, sizeof pn, "%.60s.role", pname);
            return INVALID(err, pn, "%s: must be one of user, system, developer, assistant", pn);
        }
        snprintf(pn, sizeof pn, "%.60s.content", pname);
        json_t *c = json_object_get(it, "content");
        if (!c) return INVALID(err, pn, "%s: is required", pn);
        json_t *cc = resp__content(c, pn, cv, err);
        if (!cc) return false;
        if (!resp__push(cv, json_pack("{s:s, s:o}", "role", r, "content", cc))) return OOM(err);
        return true;
    }
    if (!strcmp(type, "function_call")) {
        static const char *const keys[] = {"type", "call_id", "name", "arguments",
                                           "id",   "status",  NULL};
        if (!resp__keys(it, keys, pname, err)) return false;
        static const char *const req[] = {"call_id", "name", "arguments", NULL};
        for (int k = 0; req[k]; k++)
            if (!json_is_string(json_object_get(it, req[k]))) {
                snprintf(pn, sizeof pn, "%.60s.%s", pname, req[k]);
                return INVALID(err, pn, "%s: must be a string", pn);
            }
        json_t *call =
            json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(it, "call_id"), "type",
                      "function", "function", "name", json_object_get(it, "name"), "arguments",
                      json_object_get(it, "arguments"));
        if (!call) return OOM(err);
        // calls after an assistant turn belong to it (one turn, as a template renders it)
        size_t n = json_array_size(cv->msgs);
        json_t *last = n ? json_array_get(cv->msgs, n - 1) : NULL;
        const char *lr = json_string_value(json_object_get(last, "role"));
        if (last && lr && !strcmp(lr, "assistant") && !cv->reasoning) {
            json_t *calls = json_object_get(last, "tool_calls");
            if (!calls) json_object_set_new(last, "tool_calls", calls = json_array());
            if (!calls || json_array_append_new(calls, call)) return OOM(err);
            return true;
        }
        if (!resp__push(cv, json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content",
                                      "tool_calls", call)))
            return OOM(err);
        return true;
    }
    if (!strcmp(type, "function_call_output")) {
        static const char *const keys[] = {"type", "call_id", "output", "id", "status", NULL};
        if (!resp__keys(it, keys, pname, err)) return false;
        json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
        if (!json_is_string(id)) {
            snprintf(pn, sizeof pn, "%.60s.call_id", pname);
            return INVALID(err, pn, "%s: must be a string", pn);
        }
        if (!json_is_string(out)) {
            snprintf(pn, sizeof pn, "%.60s.output", pname);
            return INVALID(err, pn, "%s: must be a string", pn);
        }
        if (!resp__push(cv, json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id", id,
                                      "content", out)))
            return OOM(err);
        return true;
    }
    if (!strcmp(type, "reasoning")) {
        static const char *const keys[] = {
            "type", "id", "summary", "content", "encrypted_content", "status", NULL};
        if (!resp__keys(it, keys, pname, err)) return false;
        json_decref(cv->reasoning);
        cv->reasoning = resp__reasoning_text(it); // the next assistant turn's
        return true;
    }
    snprintf(pn, sizeof pn, "%.60s.type", pname);
    return UNSUPPORTED(err, pn,
                       "%s: '%.40s' items are not supported: only message, function_call, "
                       "function_call_output and reasoning",
                       pn, type);
}

/* tools: function tools as chat's functions. */
static json_t *resp__tools(json_t *tools, srv_error *err) {
    if (!json_is_array(tools)) {
        INVALID(err, "tools", "'tools' must be an array, got %s", srv_json_kind(tools));
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    char pn[64];
    json_array_foreach(tools, i, t) {
        snprintf(pn, sizeof pn, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !type) {
            INVALID(err, pn, "%s: must be an object with a string 'type'", pn);
            goto fail;
        }
        if (strcmp(type, "function") != 0) {
            snprintf(pn, sizeof pn, "tools[%zu].type", i);
            UNSUPPORTED(err, pn, "%s: '%.40s' tools are not supported: only function tools", pn,
                        type);
            goto fail;
        }
        static const char *const keys[] = {"type",       "name",   "description",
                                           "parameters", "strict", NULL};
        if (!resp__keys(t, keys, pn, err)) goto fail;
        json_t *f = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(t, k, v) {
            if (strcmp(k, "type") != 0 && !(json_is_null(v) && strcmp(k, "name") != 0))
                json_object_set(f, k, v);
        }
        if (!json_is_string(json_object_get(t, "name"))) {
            json_decref(f);
            snprintf(pn, sizeof pn, "tools[%zu].name", i);
            INVALID(err, pn, "%s: must be a string", pn);
            goto fail;
        }
        if (json_array_append_new(out,
                                  json_pack("{s:s, s:o}", "type", "function", "function", f))) {
            OOM(err);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* tool_choice: "none"/"auto"/"required", or {type:"function", name}. */
static json_t *resp__tool_choice(json_t *tc, srv_error *err) {
    if (json_is_string(tc)) return json_incref(tc); // chat validates the value
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (json_is_object(tc) && type && !strcmp(type, "function")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) {
            INVALID(err, "tool_choice.name", "'tool_choice.name' must be a string");
            return NULL;
        }
        return json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    }
    UNSUPPORTED(err, "tool_choice",
                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                "{\"type\":\"function\",\"name\":...}");
    return NULL;
}

/* text: {format: {type: text | json_object | json_schema}} as chat's
 * response_format (NULL *rf: none). */
static bool resp__text(json_t *text, json_t **rf, srv_error *err) {
    *rf = NULL;
    if (!json_is_object(text))
        return INVALID(err, "text", "'text' must be an object, got %s", srv_json_kind(text));
    static const char *const keys[] = {"format", "verbosity", NULL};
    if (!resp__keys(text, keys, "text", err)) return false;
    json_t *vb = json_object_get(text, "verbosity");
    if (vb && !json_is_null(vb) &&
        !(json_is_string(vb) && !strcmp(json_string_value(vb), "medium")))
        return UNSUPPORTED(err, "text.verbosity",
                           "'text.verbosity' other than \"medium\" is not supported");
    json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f)) return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type)
        return INVALID(err, "text.format", "'text.format' must be an object with a string 'type'");
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) {
        *rf = json_pack("{s:s}", "type", "json_object");
        return *rf ? true : OOM(err);
    }
    if (!strcmp(type, "json_schema")) {
        static const char *const fk[] = {"type", "name", "schema", "strict", "description", NULL};
        if (!resp__keys(f, fk, "text.format", err)) return false;
        json_t *js = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(f, k, v) {
            if (strcmp(k, "type") != 0) json_object_set(js, k, v);
        }
        *rf = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
        return *rf ? true : OOM(err);
    }
    return UNSUPPORTED(err, "text.format.type",
                       "'text.format.type' must be text, json_object or json_schema, got "
                       "'%.40s'",
                       type);
}

/* The parameters a response object echoes, from the request (defaults as
 * OpenAI's). */
static json_t *resp__echo(json_t *root) {
    json_t *e = json_object();
    if (!e) return NULL;
    static const struct {
        const char *key;
        const char *dflt; /* JSON text */
    } rows[] = {
        {"instructions", "null"},
        {"max_output_tokens", "null"},
        {"parallel_tool_calls", "true"},
        {"previous_response_id", "null"},
        {"reasoning", "{\"effort\":null,\"summary\":null}"},
        {"service_tier", "\"default\""},
        {"store", "true"},
        {"temperature", "1.0"},
        {"text", "{\"format\":{\"type\":\"text\"}}"},
        {"tool_choice", "\"auto\""},
        {"tools", "[]"},
        {"top_p", "1.0"},
        {"truncation", "\"disabled\""},
        {"user", "null"},
        {"metadata", "{}"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        json_t *v = json_object_get(root, rows[i].key);
        if (v && !json_is_null(v))
            json_object_set(e, rows[i].key, v);
        else
            json_object_set_new(e, rows[i].key, json_loads(rows[i].dflt, JSON_DECODE_ANY, NULL));
    }
    if (!json_object_get(json_object_get(e, "text"), "format"))
        json_object_set_new(json_object_get(e, "text"), "format",
                            json_pack("{s:s}", "type", "text"));
    return e;
}

/* Checks the fields that have no chat counterpart: store, metadata, user,
 * reasoning, include, truncation, prompt_cache_key, service_tier. */
static bool resp__check_misc(json_t *root, srv_error *err) {
    json_t *v;
    if ((v = json_object_get(root, "store")) && !json_is_boolean(v))
        return INVALID(err, "store", "'store' must be a boolean, got %s", srv_json_kind(v));
    if ((v = json_object_get(root, "stream")) && !json_is_boolean(v))
        return INVALID(err, "stream", "'stream' must be a boolean, got %s", srv_json_kind(v));
    if ((v = json_object_get(root, "metadata")) && !json_is_null(v)) {
        if (!json_is_object(v) || json_object_size(v) > 16)
            return INVALID(err, "metadata", "'metadata' must be an object of at most 16 strings");
        const char *k;
        json_t *s;
        json_object_foreach(v, k, s) {
            if (!json_is_string(s) || strlen(k) > 64 || json_string_length(s) > 512)
                return INVALID(err, "metadata",
                               "'metadata' values must be strings of at most 512 characters, "
                               "keys at most 64");
        }
    }
    static const char *const strs[] = {"user", "prompt_cache_key", "instructions",
                                       "previous_response_id", NULL};
    for (int i = 0; strs[i]; i++)
        if ((v = json_object_get(root, strs[i])) && !json_is_null(v) && !json_is_string(v))
            return INVALID(err, strs[i], "'%s' must be a string, got %s", strs[i],
                           srv_json_kind(v));
    if ((v = json_object_get(root, "reasoning")) && !json_is_null(v)) {
        static const char *const keys[] = {"effort", "summary", "generate_summary", NULL};
        if (!json_is_object(v))
            return INVALID(err, "reasoning", "'reasoning' must be an object, got %s",
                           srv_json_kind(v));
        if (!resp__keys(v, keys, "reasoning", err)) return false;
    }
    if ((v = json_object_get(root, "include")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return INVALID(err, "include", "'include' must be an array, got %s", srv_json_kind(v));
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (json_is_string(s) && !strcmp(json_string_value(s), "reasoning.encrypted_content"))
                continue;
            char pn[32];
            snprintf(pn, sizeof pn, "include[%zu]", i);
            return UNSUPPORTED(err, pn,
                               "%s: only \"reasoning.encrypted_content\" is accepted (reasoning "
                               "is answered in plain text)",
                               pn);
        }
    }
    if ((v = json_object_get(root, "truncation")) && !json_is_null(v) &&
        !(json_is_string(v) && !strcmp(json_string_value(v), "disabled")))
        return UNSUPPORTED(err, "truncation",
                           "'truncation' must be \"disabled\": a conversation longer than the "
                           "context is refused, never cut");
    if ((v = json_object_get(root, "service_tier")) && !json_is_null(v) &&
        !(json_is_string(v) &&
          (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "default"))))
        return UNSUPPORTED(err, "service_tier", "'service_tier' must be \"auto\" or \"default\"");
    return true;
}

json_t *srv_resp_to_chat(json_t *root, json_t *prev, srv_resp_req *x, srv_error *err) {
    memset(x, 0, sizeof *x);
    resp__conv cv = {0};
    json_t *chat = NULL;
    if (!json_is_object(root)) {
        INVALID(err, NULL, "the request body must be a JSON object, got %s", srv_json_kind(root));
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (resp__in(resp__fields, k)) continue;
        char pn[64];
        snprintf(pn, sizeof pn, "%.60s", k);
        UNSUPPORTED(err, pn, "Unsupported parameter: '%.64s' is not supported by this server", k);
        return NULL;
    }
    if (!resp__check_misc(root, err)) return NULL;
    json_t *input = json_object_get(root, "input");
    if (!input) {
        INVALID(err, "input", "'input' is required");
        return NULL;
    }
    if (!json_is_string(input) && !json_is_array(input)) {
        INVALID(err, "input", "'input' must be a string or an array of items, got %s",
                srv_json_kind(input));
        return NULL;
    }
    if (!(chat = json_object()) || !(cv.msgs = json_array()) ||
        !(x->items = prev ? json_copy(prev) : json_array()) || !(x->echo = resp__echo(root)))
        goto oom;
    json_t *ins = json_object_get(root, "instructions");
    if (json_is_string(ins) &&
        !resp__push(&cv, json_pack("{s:s, s:O}", "role", "system", "content", ins)))
        goto oom;
    size_t i;
    json_t *it;
    char pn[64];
    json_array_foreach(prev, i, it) {
        snprintf(pn, sizeof pn, "previous_response_id:items[%zu]", i);
        if (!resp__item(&cv, it, pn, err)) goto fail;
    }
    if (json_is_string(input)) {
        json_t *m =
            json_pack("{s:s, s:s, s:O}", "type", "message", "role", "user", "content", input);
        if (!m || json_array_append_new(x->items, m)) goto oom;
        if (!resp__push(&cv, json_pack("{s:s, s:O}", "role", "user", "content", input))) goto oom;
    } else {
        if (!json_array_size(input) && !prev) {
            INVALID(err, "input", "'input' must not be empty");
            goto fail;
        }
        json_array_foreach(input, i, it) {
            snprintf(pn, sizeof pn, "input[%zu]", i);
            if (!resp__item(&cv, it, pn, err)) goto fail;
            if (json_array_append(x->items, it)) goto oom;
        }
    }
    if (json_object_set_new(chat, "messages", cv.msgs)) {
        cv.msgs = NULL;
        goto oom;
    }
    cv.msgs = NULL;
    static const char *const same[] = {"model",  "temperature",         "top_p",
                                       "stream", "parallel_tool_calls", NULL};
    for (int s = 0; same[s]; s++)
        if ((v = json_object_get(root, same[s])) && !json_is_null(v))
            json_object_set(chat, same[s], v);
    if ((v = json_object_get(root, "max_output_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > SRV_MAX_TOKENS_LIMIT) {
            INVALID(err, "max_output_tokens",
                    "'max_output_tokens' must be an integer in [1, %d], got %s",
                    SRV_MAX_TOKENS_LIMIT, srv_json_kind(v));
            goto fail;
        }
        json_object_set(chat, "max_tokens", v);
    }
    if ((v = json_object_get(root, "tools")) && !json_is_null(v)) {
        json_t *t = resp__tools(v, err);
        if (!t) goto fail;
        if (json_array_size(t))
            json_object_set_new(chat, "tools", t);
        else
            json_decref(t);
    }
    if ((v = json_object_get(root, "tool_choice")) && !json_is_null(v)) {
        json_t *tc = resp__tool_choice(v, err);
        if (!tc) goto fail;
        json_object_set_new(chat, "tool_choice", tc);
    }
    if ((v = json_object_get(root, "text")) && !json_is_null(v)) {
        json_t *rf;
        if (!resp__text(v, &rf, err)) goto fail;
        if (rf) json_object_set_new(chat, "response_format", rf);
    }
    json_t *st = json_object_get(root, "store");
    x->store = !st || json_is_true(st);
    json_decref(cv.reasoning);
    return chat;
oom:
    OOM(err);
fail:
    json_decref(cv.msgs);
    json_decref(cv.reasoning);
    json_decref(chat);
    srv_resp_req_free(x);
    return NULL;
}

void srv_resp_req_free(srv_resp_req *x) {
    json_decref(x->echo);
    json_decref(x->items);
    memset(x, 0, sizeof *x);
}

/* Renames a chat field in err (param and message) to the Responses field
 * it came from: the chat layer names what it validated. */
static void resp__rename(srv_error *err) {
    static const struct {
        const char *chat, *resp;
    } map[] = {
        {"response_format.json_schema", "text.format"}, /* json_schema's fields are format's */
        {"response_format", "text.format"},
        {"max_tokens", "max_output_tokens"},
        {"messages", "input"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t n = strlen(map[i].chat);
        if (!strncmp(err->param, map[i].chat, n)) {
            char t[sizeof err->param];
            snprintf(t, sizeof t, "%s%s", map[i].resp, err->param + n);
            memcpy(err->param, t, sizeof t);
        }
        char *at = strstr(err->msg, map[i].chat);
        if (at) {
            char t[sizeof err->msg];
            snprintf(t, sizeof t, "%.*s%s%s", (int)(at - err->msg), err->msg, map[i].resp, at + n);
            memcpy(err->msg, t, sizeof t);
        }
    }
    // a function tool's fields sit in chat's "function" object, in the tool itself here
    if (!strncmp(err->param, "tool", 4)) {
        char *const bufs[2] = {err->param, err->msg};
        for (int k = 0; k < 2; k++) {
            char *at = strstr(bufs[k], ".function.");
            if (at) memmove(at, at + 9, strlen(at + 9) + 1);
        }
    }
}

bool srv_resp_parse(const char *body, size_t len, srv_resp_store *st, const char *tenant,
                    uint64_t now_ns, srv_request *r, srv_resp_req *x, srv_error *err) {
    memset(r, 0, sizeof *r);
    memset(x, 0, sizeof *x);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return srv_refuse(err, ADMIT_INVALID_JSON, NULL,
                          "malformed JSON at line %d, column %d (position %d): %s", je.line,
                          je.column, je.position, je.text);
    json_t *prev = NULL, *pid = json_object_get(root, "previous_response_id");
    if (json_is_string(pid) &&
        !(prev = srv_resp_store_get(st, tenant, json_string_value(pid), true, now_ns))) {
        // unknown, expired, not stored and another tenant's read the same
        srv_refuse(err, ADMIT_INVALID, "previous_response_id",
                   "Previous response with id '%.80s' not found.", json_string_value(pid));
        err->code = "previous_response_not_found";
        json_decref(root);
        return false;
    }
    json_t *chat = srv_resp_to_chat(root, prev, x, err);
    json_decref(prev);
    json_decref(root);
    if (!chat) return false;
    char *text = json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    if (!text) {
        srv_resp_req_free(x);
        return OOM(err);
    }
    bool ok = srv_request_parse(SRV_ROUTE_CHAT, text, strlen(text), r, err);
    free(text);
    if (!ok) {
        resp__rename(err);
        srv_resp_req_free(x);
        return false;
    }
    r->route = SRV_ROUTE_RESPONSES;
    return true;
}

// ----------------------------------------------------------------------------
// Answers

json_t *srv_resp_usage(int32_t n_prompt, int32_t n_cached, int32_t n_gen, int32_t n_reasoning) {
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", (int)n_prompt,
                     "input_tokens_details", "cached_tokens", (int)n_cached, "output_tokens",
                     (int)n_gen, "output_tokens_details", "reasoning_tokens", (int)n_reasoning,
                     "total_tokens", (int)(n_prompt + n_gen));
}

json_t *srv_resp_object(const json_t *echo, const char *id, long long created,
                        const char *model_name, const char *status, const json_t *output,
                        json_t *usage) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:b, s:n, s:n, s:s}", "id", id, "object",
                          "response", "created_at", (json_int_t)created, "status", status,
                          "background", 0, "error", "incomplete_details", "model", model_name);
    if (!o) {
        json_decref(usage);
        return NULL;
    }
    if (!strcmp(status, "incomplete"))
        json_object_set_new(o, "incomplete_details",
                            json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_update_missing(o, (json_t *)echo);
    json_object_set_new(o, "output", output ? json_deep_copy(output) : json_array());
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

/* Appends one event {type, sequence_number, ...j} (j stolen). */
static bool resp__ev(srv_resp_out *o, const char *type, json_t *j) {
    if (!j) return false;
    if (!o->b) {
        json_decref(j);
        return true;
    }
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer(o->seq++));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    bool ok = s && srv_buf_add(o->b, "event: ", 7) && srv_buf_add(o->b, type, strlen(type)) &&
              srv_buf_add(o->b, "\ndata: ", 7) && srv_buf_add(o->b, s, strlen(s)) &&
              srv_buf_add(o->b, "\n\n", 2);
    free(s);
    return ok;
}

static bool resp__out_text(srv_resp_out *o, bool reasoning, const char *s, size_t n);

/* The output array exists (a non-streamed answer never called start). */
static bool resp__ready(srv_resp_out *o) { return o->output || (o->output = json_array()); }

/* A new item id: prefix + 24 hex digits. */
static void resp__id(const char *prefix, char *buf, size_t cap) { srv_make_id(prefix, buf, cap); }

bool srv_resp_out_start(srv_resp_out *o, srv_buf *b, const json_t *resp) {
    o->b = b;
    if (!o->output && !(o->output = json_array())) return false;
    return resp__ev(o, "response.created", json_pack("{s:O}", "response", resp)) &&
           resp__ev(o, "response.in_progress", json_pack("{s:O}", "response", resp));
}

/* The open item's text as a JSON string (new). */
static json_t *resp__text_json(const srv_resp_out *o) {
    return srv__jstr(o->text ? o->text : "", o->text_len);
}

/* The open item as it stands, status given. */
static json_t *resp__item_now(const srv_resp_out *o, const char *status) {
    json_t *t = resp__text_json(o);
    if (!t) return NULL;
    if (o->open == 2)
        return json_pack("{s:s, s:s, s:[{s:s, s:O}], s:[{s:s, s:o}], s:s}", "id", o->item_id,
                         "type", "reasoning", "summary", "type", "summary_text", "text", t,
                         "content", "type", "reasoning_text", "text", t, "status", status);
    return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o, s:[]}]}", "id", o->item_id, "type",
                     "message", "status", status, "role", "assistant", "content", "type",
                     "output_text", "text", t, "annotations");
}

bool srv_resp_out_close(srv_resp_out *o) {
    if (!resp__ready(o)) return false;
    if (!o->open && o->pend_len && !json_array_size(o->output)) { // nothing but whitespace
        size_t n = o->pend_len;
        o->pend_len = 0;
        if (!resp__out_text(o, false, o->pend, n)) return false;
    }
    o->pend_len = 0;
    if (!o->open && !json_array_size(o->output)) { // an answer with nothing: an empty message
        resp__id("msg_", o->item_id, sizeof o->item_id);
        o->open = 1;
        o->text_len = 0;
        json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", o->item_id, "type", "message",
                               "status", "in_progress", "role", "assistant", "content");
        if (!resp__ev(o, "response.output_item.added",
                      json_pack("{s:i, s:o}", "output_index", 0, "item", it)) ||
            !resp__ev(o, "response.content_part.added",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", o->item_id,
                                "output_index", 0, "content_index", 0, "part", "type",
                                "output_text", "text", "", "annotations")))
            return false;
    }
    if (!o->open) return true;
    int idx = (int)json_array_size(o->output);
    bool ok;
    if (o->open == 2) {
        ok = resp__ev(o, "response.reasoning_summary_text.done",
                      json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index", idx,
                                "summary_index", 0, "text", resp__text_json(o))) &&
             resp__ev(o, "response.reasoning_summary_part.done",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:o}}", "item_id", o->item_id,
                                "output_index", idx, "summary_index", 0, "part", "type",
                                "summary_text", "text", resp__text_json(o)));
    } else {
        ok = resp__ev(o, "response.output_text.done",
                      json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index", idx,
                                "content_index", 0, "text", resp__text_json(o))) &&
             resp__ev(o, "response.content_part.done",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:o, s:[]}}", "item_id", o->item_id,
                                "output_index", idx, "content_index", 0, "part", "type",
                                "output_text", "text", resp__text_json(o), "annotations"));
    }
    json_t *item = resp__item_now(o, "completed");
    ok = ok && item &&
         resp__ev(o, "response.output_item.done",
                  json_pack("{s:i, s:O}", "output_index", idx, "item", item)) &&
         !json_array_append(o->output, item);
    json_decref(item);
    o->open = 0;
    o->text_len = 0;
    return ok;
}

/* Appends s[0..n) to the pending whitespace. */
static bool resp__pend(srv_resp_out *o, const char *s, size_t n) {
    char *p = realloc(o->pend, o->pend_len + n + 1);
    if (!p) return false;
    o->pend = p;
    memcpy(o->pend + o->pend_len, s, n);
    o->pend_len += n;
    return true;
}

static bool resp__all_ws(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return false;
    return true;
}

bool srv_resp_out_text(srv_resp_out *o, bool reasoning, const char *s, size_t n) {
    if (!n) return true;
    if (!resp__ready(o)) return false;
    // message text that is only whitespace so far waits: before a tool call it is
    // dropped (as the chat route answers content null), before text it leads it
    if (!reasoning && o->open != 1 && (o->pend_len || resp__all_ws(s, n))) {
        if (!resp__pend(o, s, n)) return false;
        if (resp__all_ws(o->pend, o->pend_len)) return true;
        size_t m = o->pend_len;
        o->pend_len = 0;
        return resp__out_text(o, false, o->pend, m);
    }
    return resp__out_text(o, reasoning, s, n);
}

/* srv_resp_out_text without the wait for whitespace. */
static bool resp__out_text(srv_resp_out *o, bool reasoning, const char *s, size_t n) {
    int kind = reasoning ? 2 : 1;
    if (o->open != kind) {
        if (o->open && !srv_resp_out_close(o)) return false;
        resp__id(reasoning ? "rs_" : "msg_", o->item_id, sizeof o->item_id);
        o->open = kind;
        o->text_len = 0;
        int idx = (int)json_array_size(o->output);
        json_t *it =
            reasoning ? json_pack("{s:s, s:s, s:[], s:s}", "id", o->item_id, "type", "reasoning",
                                  "summary", "status", "in_progress")
                      : json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", o->item_id, "type", "message",
                                  "status", "in_progress", "role", "assistant", "content");
        bool ok = resp__ev(o, "response.output_item.added",
                           json_pack("{s:i, s:o}", "output_index", idx, "item", it));
        if (ok && reasoning)
            ok = resp__ev(o, "response.reasoning_summary_part.added",
                          json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", o->item_id,
                                    "output_index", idx, "summary_index", 0, "part", "type",
                                    "summary_text", "text", ""));
        else if (ok)
            ok = resp__ev(o, "response.content_part.added",
                          json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", o->item_id,
                                    "output_index", idx, "content_index", 0, "part", "type",
                                    "output_text", "text", "", "annotations"));
        if (!ok) return false;
    }
    if (o->text_len + n + 1 > o->text_cap) {
        size_t cap = (o->text_len + n + 1) * 2;
        char *p = realloc(o->text, cap);
        if (!p) return false;
        o->text = p, o->text_cap = cap;
    }
    memcpy(o->text + o->text_len, s, n);
    o->text_len += n;
    o->text[o->text_len] = 0;
    int idx = (int)json_array_size(o->output);
    json_t *d = srv__jstr(s, n);
    if (!d) return false;
    if (reasoning)
        return resp__ev(o, "response.reasoning_summary_text.delta",
                        json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index",
                                  idx, "summary_index", 0, "delta", d));
    return resp__ev(o, "response.output_text.delta",
                    json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->item_id, "output_index", idx,
                              "content_index", 0, "delta", d));
}

bool srv_resp_out_call(srv_resp_out *o, const char *call_id, const char *name, const char *args) {
    if (!resp__ready(o)) return false;
    o->pend_len = 0; // whitespace before a call is no message
    if (o->open && !srv_resp_out_close(o)) return false;
    char id[48];
    resp__id("fc_", id, sizeof id);
    int idx = (int)json_array_size(o->output);
    json_t *item =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status",
                  "completed", "call_id", call_id, "name", name, "arguments", args);
    if (!item) return false;
    bool ok =
        resp__ev(o, "response.output_item.added",
                 json_pack("{s:i, s:{s:s, s:s, s:s, s:s, s:s, s:s}}", "output_index", idx, "item",
                           "id", id, "type", "function_call", "status", "in_progress", "call_id",
                           call_id, "name", name, "arguments", "")) &&
        resp__ev(o, "response.function_call_arguments.delta",
                 json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", idx, "delta", args)) &&
        resp__ev(
            o, "response.function_call_arguments.done",
            json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", idx, "arguments", args)) &&
        resp__ev(o, "response.output_item.done",
                 json_pack("{s:i, s:O}", "output_index", idx, "item", item)) &&
        !json_array_append(o->output, item);
    json_decref(item);
    return ok;
}

bool srv_resp_out_end(srv_resp_out *o, const json_t *resp) {
    const char *st = json_string_value(json_object_get(resp, "status"));
    const char *type = st && !strcmp(st, "incomplete") ? "response.incomplete"
                       : st && !strcmp(st, "failed")   ? "response.failed"
                                                       : "response.completed";
    return resp__ev(o, type, json_pack("{s:O}", "response", resp));
}

bool srv_resp_out_error(srv_resp_out *o, const srv_error *e) {
    return resp__ev(o, "error",
                    json_pack("{s:s?, s:s, s:s?}", "code", e->code ? e->code : e->type, "message",
                              e->msg, "param", e->param[0] ? e->param : NULL));
}

void srv_resp_out_free(srv_resp_out *o) {
    json_decref(o->output);
    free(o->text);
    free(o->pend);
    memset(o, 0, sizeof *o);
}
