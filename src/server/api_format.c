/* api_format.c — structured output fields of a generation request:
 * OpenAI's response_format ({"type":"text"|"json_object"|"json_schema"})
 * and llama.cpp's grammar (GBNF text), compiled here, on the HTTP thread,
 * into the grammar the engine constrains decoding with (kvseal/grammar.h).
 * Compilation is bounded (GRAMMAR_MAX_*), so a hostile schema or grammar
 * costs a bounded amount of work and gets a 400 naming the parameter. */
#include "server_int.h"

#include <string.h>

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

/* A compile error as the client's answer: unsupported keywords are
 * unsupported_parameter, the rest invalid_request_error; both 400. */
static bool api__grammar_error(srv_error *err, const char *param, ks_err e, const ks_errbuf *eb) {
    if (e == KS_ERR_NOMEM)
        return srv_fail(err, 503, "overloaded", "out of memory compiling %s", param);
    return srv_refuse(err, e == KS_ERR_UNSUPPORTED ? ADMIT_UNSUPPORTED_PARAMETER : ADMIT_INVALID,
                      param, "invalid '%s': %s", param, eb->msg);
}

/* Only the listed keys may appear in object o (named by path). */
static bool api__only_keys(json_t *o, const char *const *keys, const char *path, srv_error *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool ok = false;
        for (const char *const *q = keys; *q && !ok; q++)
            ok = !strcmp(*q, k);
        if (!ok) {
            char param[64];
            snprintf(param, sizeof param, "%.30s.%.30s", path, k);
            return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, param,
                              "Unsupported parameter: '%s' is not supported by this server", param);
        }
    }
    return true;
}

bool srv_request_format(srv_request *r, json_t *root, srv_error *err) {
    json_t *rf = json_object_get(root, "response_format");
    json_t *gr = json_object_get(root, "grammar");
    if (rf && json_is_null(rf)) rf = NULL;
    if (gr && json_is_null(gr)) gr = NULL;
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    if (gr) {
        if (!json_is_string(gr)) return INVALID(err, "grammar", "'grammar' must be a string");
        if (rf) {
            json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
            if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
                return INVALID(err, "grammar",
                               "'grammar' and a JSON 'response_format' cannot be combined");
        }
        ks_err e = grammar_parse(json_string_value(gr), json_string_length(gr), &r->grammar, &eb);
        if (e) return api__grammar_error(err, "grammar", e, &eb);
        r->grammar_param = "grammar";
        return true;
    }
    if (!rf) return true;
    if (!json_is_object(rf))
        return INVALID(err, "response_format", "'response_format' must be an object");
    json_t *t = json_object_get(rf, "type");
    if (!json_is_string(t))
        return INVALID(
            err, "response_format.type",
            "'response_format.type' must be one of 'text', 'json_object', 'json_schema'");
    const char *ts = json_string_value(t);
    ks_err e;
    if (!strcmp(ts, "text")) {
        static const char *const keys[] = {"type", NULL};
        return api__only_keys(rf, keys, "response_format", err);
    } else if (!strcmp(ts, "json_object")) {
        static const char *const keys[] = {"type", NULL};
        if (!api__only_keys(rf, keys, "response_format", err)) return false;
        json_t *any = json_pack("{s:s}", "type", "object");
        if (!any) return srv_fail(err, 503, "overloaded", "out of memory");
        e = grammar_from_schema(any, &r->grammar, &eb);
        json_decref(any);
    } else if (!strcmp(ts, "json_schema")) {
        static const char *const keys[] = {"type", "json_schema", NULL};
        static const char *const jkeys[] = {"name", "schema", "strict", "description", NULL};
        if (!api__only_keys(rf, keys, "response_format", err)) return false;
        json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(js))
            return srv_refuse(err, ADMIT_MISSING_PARAMETER, "response_format.json_schema",
                              "'response_format.json_schema' must be an object");
        if (!api__only_keys(js, jkeys, "response_format.json_schema", err)) return false;
        json_t *nm = json_object_get(js, "name"), *st = json_object_get(js, "strict");
        if (!json_is_string(nm))
            return srv_refuse(err, ADMIT_MISSING_PARAMETER, "response_format.json_schema.name",
                              "'response_format.json_schema.name' must be a string");
        if (st && !json_is_boolean(st) && !json_is_null(st))
            return INVALID(err, "response_format.json_schema.strict",
                           "'response_format.json_schema.strict' must be a boolean");
        json_t *sc = json_object_get(js, "schema");
        json_t *any = NULL;
        if (!sc) sc = any = json_pack("{s:s}", "type", "object"); // OpenAI: any object
        if (!sc) return srv_fail(err, 503, "overloaded", "out of memory");
        e = grammar_from_schema(sc, &r->grammar, &eb);
        json_decref(any);
        if (e) return api__grammar_error(err, "response_format.json_schema.schema", e, &eb);
    } else {
        return INVALID(err, "response_format.type",
                       "'response_format.type' must be one of 'text', 'json_object', "
                       "'json_schema', got '%.40s'",
                       ts);
    }
    if (e) return api__grammar_error(err, "response_format", e, &eb);
    r->grammar_param = "response_format";
    return true;
}
