/* schema.c — JSON schema -> GBNF (see grammar.h), then compiled by
 * grammar_parse (compile.c) for grammar_from_schema.
 *
 * Every subschema becomes one rule whose body accepts the compact JSON
 * texts valid against it, with bounded optional whitespace (`ws`: nothing,
 * one space, or a newline and up to 16 spaces) only after '{', '[', ':'
 * and ',' and before the closing bracket, so a model cannot loop on
 * whitespace. Objects emit their properties in the schema's order, as
 * OpenAI's strict mode does; optional ones may be left out (two rule chains:
 * "nothing emitted yet" and "something emitted, so a comma comes first").
 * Keywords outside the supported set are refused by name and JSON path:
 * silently ignoring one would let the output break the schema. Keywords
 * that constrain only another type (maxLength on an integer) are no-ops,
 * as JSON Schema says. */
#include "kvseal/grammar.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_DEPTH 64 /* nesting of subschemas */
#define SC_MAX_REFS 256

typedef struct sc_buf {
    char *p;
    size_t n, cap;
} sc_buf;

typedef struct sc_ctx {
    const json_t *root;
    char prefix[48];
    sc_buf out;
    uint32_t n_rules;
    struct {
        char *ref;
        char name[64];
    } refs[SC_MAX_REFS];
    int n_refs;
    int depth;
    ks_errbuf *eb;
    ks_err err;
} sc_ctx;

static bool sc_fail(sc_ctx *c, ks_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool sc_fail(sc_ctx *c, ks_err code, const char *fmt, ...) {
    if (c->err) return false;
    char msg[440];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err = ks_seterr(c->eb, code, "%s", msg);
    return false;
}

static bool sc_add(sc_ctx *c, sc_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > GRAMMAR_MAX_TEXT)
        return sc_fail(c, KS_ERR_NOSPACE, "schema: the grammar it compiles to is above %d bytes",
                       GRAMMAR_MAX_TEXT);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool sc_printf(sc_ctx *c, sc_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool sc_printf(sc_ctx *c, sc_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return sc_fail(c, KS_ERR_INTERNAL, "schema: rule too long");
    return sc_add(c, b, tmp, (size_t)n);
}

/* Appends s[0..n) as a GBNF string literal. */
static bool sc_lit(sc_ctx *c, sc_buf *b, const char *s, size_t n) {
    if (!sc_add(c, b, "\"", 1)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch;
            if (!sc_add(c, b, esc, 2)) return false;
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            if (!sc_add(c, b, esc, 4)) return false;
        } else if (!sc_add(c, b, (const char *)&ch, 1))
            return false;
    }
    return sc_add(c, b, "\"", 1);
}

/* Appends the compact JSON text of v as a literal. */
static bool sc_json_lit(sc_ctx *c, sc_buf *b, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
    bool ok = sc_lit(c, b, t, strlen(t));
    free(t);
    return ok;
}

static void sc_newname(sc_ctx *c, char name[64]) {
    snprintf(name, 64, "%ss%u", c->prefix, ++c->n_rules);
}

/* Emits `name ::= body`. */
static bool sc_rule(sc_ctx *c, const char *name, const sc_buf *body) {
    return sc_printf(c, &c->out, "%s ::= ", name) &&
           sc_add(c, &c->out, body->p ? body->p : "", body->n) && sc_add(c, &c->out, "\n", 1);
}

static const char *const sc_annotations[] = {
    "title",      "description", "default",   "examples", "$schema",     "$id", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", NULL,
};
static const char *const sc_keywords[] = {
    "type",   "enum",     "const",      "anyOf",     "oneOf",
    "allOf",  "$ref",     "properties", "required",  "additionalProperties",
    "items",  "minItems", "maxItems",   "minLength", "maxLength",
    "format", NULL,
};

static bool sc_in(const char *const *set, const char *k) {
    for (; *set; set++)
        if (!strcmp(*set, k)) return true;
    return false;
}

static bool sc_schema(sc_ctx *c, const json_t *s, const char *path, const char *force,
                      char name[64]);

/* Reads a non-negative integer keyword (absent: *v unchanged). */
static bool sc_count(sc_ctx *c, const json_t *s, const char *key, const char *path, long long *v) {
    const json_t *x = json_object_get(s, key);
    if (!x) return true;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s' must be a non-negative integer", path,
                       key);
    if (json_integer_value(x) > GRAMMAR_MAX_REPEAT)
        return sc_fail(c, KS_ERR_UNSUPPORTED, "schema at %s: '%s' above %d is not supported", path,
                       key, GRAMMAR_MAX_REPEAT);
    *v = json_integer_value(x);
    return true;
}

/* "{m,n}" for GBNF ({m,} when n < 0). */
static void sc_rep(char *buf, size_t cap, long long m, long long n) {
    if (n < 0)
        snprintf(buf, cap, "{%lld,}", m);
    else
        snprintf(buf, cap, "{%lld,%lld}", m, n);
}

static bool sc_object(sc_ctx *c, const json_t *s, const char *path, const char *self, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'properties' must be an object", path);
    if (req && !json_is_array(req))
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'required' must be an array", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sc_fail(c, KS_ERR_INVAL,
                       "schema at %s: 'additionalProperties' must be a boolean or a schema", path);
    size_t n = props ? json_object_size(props) : 0;
    // every required name must be a declared property: only those are emitted
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r))
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'required' must hold strings", path);
        if (!props || !json_object_get(props, json_string_value(r)))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: required property '%.64s' is not in 'properties' "
                           "(only declared properties are generated)",
                           path, json_string_value(r));
    }
    if (n == 0) {
        if (json_is_object(addl)) { // a map: string -> schema
            char v[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s/additionalProperties", path);
            if (!sc_schema(c, addl, p2, NULL, v)) return false;
            return sc_printf(c, b,
                             "\"{\" %sws ( %sstring %sws \":\" %sws %s %sws ( \",\" %sws %sstring "
                             "%sws \":\" %sws %s %sws )* )? \"}\"",
                             P, P, P, P, v, P, P, P, P, P, v, P);
        }
        if (json_is_false(addl)) return sc_printf(c, b, "\"{\" %sws \"}\"", P);
        return sc_printf(c, b, "%sobject", P);
    }
    // one rule per property value, then the two chains
    char(*vals)[64] = malloc(n * sizeof *vals);
    bool *required = calloc(n, sizeof *required);
    const char **keys = malloc(n * sizeof *keys);
    bool ok = vals && required && keys;
    if (!ok) sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
    const char *k;
    const json_t *v;
    i = 0;
    json_object_foreach((json_t *)props, k, v) {
        if (!ok) break;
        char p2[256];
        snprintf(p2, sizeof p2, "%.160s/properties/%.64s", path, k);
        keys[i] = k;
        ok = sc_schema(c, v, p2, NULL, vals[i]);
        size_t j;
        const json_t *rr;
        json_array_foreach(req, j, rr) if (!strcmp(json_string_value(rr), k)) required[i] = true;
        i++;
    }
    // a{i}: after something was emitted; f{i}: nothing emitted yet
    for (size_t j = n; ok && j-- > 0;) {
        sc_buf kv = {0};
        ok = sc_printf(c, &kv, "%s", "");
        if (ok) {
            json_t *ks = json_string(keys[j]);
            ok = ks && sc_json_lit(c, &kv, ks);
            json_decref(ks);
        }
        char after[80] = "";
        if (j + 1 < n) snprintf(after, sizeof after, "%s-a%zu", self, j + 1);
        ok = ok && sc_printf(c, &kv, " %sws \":\" %sws %s %sws", P, P, vals[j], P);
        ok = ok && sc_printf(c, &c->out, "%s-a%zu ::= ( \",\" %sws ", self, j, P) &&
             sc_add(c, &c->out, kv.p, kv.n) &&
             sc_printf(c, &c->out, " )%s %s\n", required[j] ? "" : "?", after);
        ok = ok && sc_printf(c, &c->out, "%s-f%zu ::= ", self, j) && sc_add(c, &c->out, kv.p, kv.n);
        if (ok && required[j])
            ok = sc_printf(c, &c->out, " %s\n", after);
        else if (ok) {
            if (j + 1 < n)
                ok = sc_printf(c, &c->out, " %s | %s-f%zu\n", after, self, j + 1);
            else
                ok = sc_printf(c, &c->out, " | \"\"\n");
        }
        free(kv.p);
    }
    if (ok) ok = sc_printf(c, b, "\"{\" %sws %s-f0 \"}\"", P, self);
    free(vals);
    free(required);
    free(keys);
    return ok;
}

static bool sc_array(sc_ctx *c, const json_t *s, const char *path, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *items = json_object_get(s, "items");
    char e[64];
    if (items && json_is_array(items))
        return sc_fail(c, KS_ERR_UNSUPPORTED,
                       "schema at %s: 'items' as an array (tuples) is not supported", path);
    if (items) {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s/items", path);
        if (!sc_schema(c, items, p2, NULL, e)) return false;
    } else {
        snprintf(e, sizeof e, "%svalue", P);
    }
    long long lo = 0, hi = -1;
    if (!sc_count(c, s, "minItems", path, &lo) || !sc_count(c, s, "maxItems", path, &hi))
        return false;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: maxItems %lld below minItems %lld", path, hi,
                       lo);
    if (hi == 0) return sc_printf(c, b, "\"[\" %sws \"]\"", P);
    char rep[48];
    sc_rep(rep, sizeof rep, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    if (lo == 0)
        return sc_printf(c, b, "\"[\" %sws ( %s %sws ( \",\" %sws %s %sws )%s )? \"]\"", P, e, P, P,
                         e, P, rep);
    return sc_printf(c, b, "\"[\" %sws %s %sws ( \",\" %sws %s %sws )%s \"]\"", P, e, P, P, e, P,
                     rep);
}

static bool sc_string(sc_ctx *c, const json_t *s, const char *path, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *f = json_object_get(s, "format");
    if (f) {
        if (!json_is_string(f))
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'format' must be a string", path);
        const char *fs = json_string_value(f);
        static const char *const formats[] = {"date", "time", "date-time", "uuid", NULL};
        if (!sc_in(formats, fs))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: format '%.40s' is not supported (date, time, date-time, "
                           "uuid are)",
                           path, fs);
        // a fixed shape; minLength/maxLength are not combined with it
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: 'minLength'/'maxLength' together with 'format' is not "
                           "supported",
                           path);
        return sc_printf(c, b, "\"\\\"\" %s%s \"\\\"\"", P, fs);
    }
    long long lo = 0, hi = -1;
    if (!sc_count(c, s, "minLength", path, &lo) || !sc_count(c, s, "maxLength", path, &hi))
        return false;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: maxLength %lld below minLength %lld", path,
                       hi, lo);
    if (lo == 0 && hi < 0) return sc_printf(c, b, "%sstring", P);
    char rep[48];
    sc_rep(rep, sizeof rep, lo, hi);
    return sc_printf(c, b, "\"\\\"\" %schar%s \"\\\"\"", P, rep);
}

/* The body for schema s restricted to one type name. */
static bool sc_typed(sc_ctx *c, const json_t *s, const char *type, const char *path,
                     const char *self, sc_buf *b) {
    const char *P = c->prefix;
    if (!strcmp(type, "object")) return sc_object(c, s, path, self, b);
    if (!strcmp(type, "array")) return sc_array(c, s, path, b);
    if (!strcmp(type, "string")) return sc_string(c, s, path, b);
    if (!strcmp(type, "number")) return sc_printf(c, b, "%snumber", P);
    if (!strcmp(type, "integer")) return sc_printf(c, b, "%sinteger", P);
    if (!strcmp(type, "boolean")) return sc_printf(c, b, "%sboolean", P);
    if (!strcmp(type, "null")) return sc_printf(c, b, "%snull", P);
    return sc_fail(c, KS_ERR_INVAL, "schema at %s: unknown type '%.40s'", path, type);
}

/* Resolves a local $ref to its schema; NULL (error set) if it cannot. */
static const json_t *sc_resolve(sc_ctx *c, const char *ref, const char *path) {
    if (!strcmp(ref, "#")) return c->root;
    const char *pfx[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pfx[i]);
        if (strncmp(ref, pfx[i], n)) continue;
        // one JSON-pointer token (~1 = '/', ~0 = '~')
        char name[256];
        size_t k = 0;
        for (const char *q = ref + n; *q; q++) {
            if (*q == '/' || k + 1 >= sizeof name) {
                sc_fail(c, KS_ERR_UNSUPPORTED,
                        "schema at %s: $ref '%.100s' is not supported "
                        "(#/$defs/NAME or #/definitions/NAME)",
                        path, ref);
                return NULL;
            }
            if (*q == '~' && (q[1] == '0' || q[1] == '1')) {
                name[k++] = q[1] == '0' ? '~' : '/';
                q++;
            } else
                name[k++] = *q;
        }
        name[k] = 0;
        const json_t *defs = json_object_get(c->root, i ? "definitions" : "$defs");
        const json_t *t = json_is_object(defs) ? json_object_get(defs, name) : NULL;
        if (!t) {
            sc_fail(c, KS_ERR_INVAL, "schema at %s: $ref '%.100s' does not resolve", path, ref);
            return NULL;
        }
        return t;
    }
    sc_fail(c, KS_ERR_UNSUPPORTED,
            "schema at %s: $ref '%.100s' is not supported (only local #/$defs/NAME, "
            "#/definitions/NAME and #)",
            path, ref);
    return NULL;
}

/* Emits the rule for schema s (named force, or a new name) and writes its
 * name to name. */
static bool sc_schema(sc_ctx *c, const json_t *s, const char *path, const char *force,
                      char name[64]) {
    const char *P = c->prefix;
    if (c->err) return false;
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_fail(c, KS_ERR_NOSPACE, "schema at %s: nested deeper than %d", path,
                       SC_MAX_DEPTH);
    }
    bool ok = true;
    sc_buf b = {0};
    if (force)
        snprintf(name, 64, "%s", force);
    else
        sc_newname(c, name);
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        ok = sc_printf(c, &b, "%svalue", P);
        goto emit;
    }
    if (!json_is_object(s)) {
        ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: a schema must be an object or true", path);
        goto out;
    }
    const char *k;
    const json_t *v;
    bool any_kw = false;
    json_object_foreach((json_t *)s, k, v) {
        if (sc_in(sc_annotations, k)) continue;
        if (!sc_in(sc_keywords, k)) {
            ok = sc_fail(c, KS_ERR_UNSUPPORTED, "schema at %s: unsupported keyword '%.64s'", path,
                         k);
            goto out;
        }
        any_kw = true;
    }
    if (!any_kw) {
        ok = sc_printf(c, &b, "%svalue", P);
        goto emit;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: '$ref' must be a string", path);
            goto out;
        }
        json_object_foreach((json_t *)s, k, v) {
            if (strcmp(k, "$ref") && !sc_in(sc_annotations, k)) {
                ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                             "schema at %s: keyword '%.64s' next to '$ref' is not supported", path,
                             k);
                goto out;
            }
        }
        const char *rs = json_string_value(ref);
        int found = -1;
        for (int i = 0; i < c->n_refs; i++)
            if (!strcmp(c->refs[i].ref, rs)) found = i;
        if (found < 0) {
            const json_t *t = sc_resolve(c, rs, path);
            if (!t) {
                ok = false;
                goto out;
            }
            if (c->n_refs >= SC_MAX_REFS) {
                ok = sc_fail(c, KS_ERR_NOSPACE, "schema: more than %d distinct $refs", SC_MAX_REFS);
                goto out;
            }
            found = c->n_refs++;
            c->refs[found].ref = strdup(rs);
            if (!c->refs[found].ref) {
                c->n_refs--;
                ok = sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
                goto out;
            }
            sc_newname(c, c->refs[found].name);
            char tn[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s", rs + 1);
            if (!sc_schema(c, t, p2[0] ? p2 : "/", c->refs[found].name, tn)) {
                ok = false;
                goto out;
            }
        }
        ok = sc_printf(c, &b, "%s", c->refs[found].name);
        goto emit;
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (cn) {
        ok = sc_json_lit(c, &b, cn);
        goto emit;
    }
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'enum' must be a non-empty array", path);
            goto out;
        }
        size_t i;
        json_array_foreach(en, i, v) {
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_json_lit(c, &b, v))) goto out;
        }
        goto emit;
    }
    const char *combo = json_object_get(s, "anyOf")   ? "anyOf"
                        : json_object_get(s, "oneOf") ? "oneOf"
                        : json_object_get(s, "allOf") ? "allOf"
                                                      : NULL;
    if (combo) {
        const json_t *arr = json_object_get(s, combo);
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s' must be a non-empty array", path,
                         combo);
            goto out;
        }
        if (!strcmp(combo, "allOf") && json_array_size(arr) != 1) {
            ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                         "schema at %s: 'allOf' with more than one schema is not supported", path);
            goto out;
        }
        json_object_foreach((json_t *)s, k, v) {
            if (strcmp(k, combo) && !sc_in(sc_annotations, k)) {
                ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                             "schema at %s: keyword '%.64s' next to '%s' is not supported", path, k,
                             combo);
                goto out;
            }
        }
        size_t i;
        json_array_foreach(arr, i, v) {
            char sub[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s/%s/%zu", path, combo, i);
            if (!(ok = sc_schema(c, v, p2, NULL, sub))) goto out;
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_printf(c, &b, "%s", sub))) goto out;
        }
        goto emit;
    }
    const json_t *ty = json_object_get(s, "type");
    if (ty && json_is_string(ty)) {
        ok = sc_typed(c, s, json_string_value(ty), path, name, &b);
    } else if (ty && json_is_array(ty) && json_array_size(ty) > 0) {
        size_t i;
        json_array_foreach(ty, i, v) {
            if (!json_is_string(v)) {
                ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'type' must hold strings", path);
                goto out;
            }
            char sub[64];
            sc_newname(c, sub);
            sc_buf sb = {0};
            ok = sc_typed(c, s, json_string_value(v), path, sub, &sb) && sc_rule(c, sub, &sb);
            free(sb.p);
            if (!ok) goto out;
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_printf(c, &b, "%s", sub))) goto out;
        }
    } else if (ty) {
        ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'type' must be a string or a non-empty array",
                     path);
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
               json_object_get(s, "additionalProperties")) {
        ok = sc_object(c, s, path, name, &b); // implied by the keywords: a subset is still valid
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
               json_object_get(s, "maxItems")) {
        ok = sc_array(c, s, path, &b);
    } else {
        ok = sc_string(c, s, path, &b); // minLength / maxLength / format
    }
emit:
    if (ok) ok = sc_rule(c, name, &b);
out:
    free(b.p);
    c->depth--;
    return ok;
}

/* The shared rules every schema grammar uses. */
static bool sc_primitives(sc_ctx *c) {
    const char *P = c->prefix;
    return sc_printf(c, &c->out, "%sws ::= ( \" \" | \"\\n\" \" \"{0,16} )?\n", P) &&
           sc_printf(c, &c->out, "%sstring ::= \"\\\"\" %schar* \"\\\"\"\n", P, P) &&
           sc_printf(c, &c->out,
                     "%schar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                     "[0-9a-fA-F]{4} )\n",
                     P) &&
           sc_printf(c, &c->out, "%sint ::= \"0\" | [1-9] [0-9]{0,15}\n", P) &&
           sc_printf(c, &c->out, "%sinteger ::= \"-\"? %sint\n", P, P) &&
           sc_printf(
               c, &c->out,
               "%snumber ::= \"-\"? %sint ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n", P,
               P) &&
           sc_printf(c, &c->out, "%sboolean ::= \"true\" | \"false\"\n", P) &&
           sc_printf(c, &c->out, "%snull ::= \"null\"\n", P) &&
           sc_printf(c, &c->out,
                     "%svalue ::= %sobject | %sarray | %sstring | %snumber | %sboolean | %snull\n",
                     P, P, P, P, P, P, P) &&
           sc_printf(c, &c->out, "%skv ::= %sstring %sws \":\" %sws %svalue %sws\n", P, P, P, P, P,
                     P) &&
           sc_printf(c, &c->out, "%sobject ::= \"{\" %sws ( %skv ( \",\" %sws %skv )* )? \"}\"\n",
                     P, P, P, P, P) &&
           sc_printf(c, &c->out,
                     "%sarray ::= \"[\" %sws ( %svalue %sws ( \",\" %sws %svalue %sws )* )? "
                     "\"]\"\n",
                     P, P, P, P, P, P, P) &&
           sc_printf(c, &c->out,
                     "%sdate ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] "
                     "| [12] [0-9] | \"3\" [01] )\n",
                     P) &&
           sc_printf(c, &c->out,
                     "%stime ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                     "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                     "[0-5] [0-9] )\n",
                     P) &&
           sc_printf(c, &c->out, "%sdate-time ::= %sdate \"T\" %stime\n", P, P, P) &&
           sc_printf(c, &c->out,
                     "%suuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
                     "[0-9a-f]{4} \"-\" [0-9a-f]{12}\n",
                     P);
}

ks_err grammar_schema_gbnf(const json_t *schema, const char *prefix, char **gbnf, ks_errbuf *eb) {
    KS_ASSERT(gbnf);
    *gbnf = NULL;
    if (!prefix) prefix = "";
    if (strlen(prefix) > 40) return ks_seterr(eb, KS_ERR_INVAL, "schema: prefix too long");
    for (const char *q = prefix; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '-'))
            return ks_seterr(eb, KS_ERR_INVAL, "schema: prefix '%s' is not a rule name", prefix);
    if (!schema) return ks_seterr(eb, KS_ERR_INVAL, "schema: NULL");
    sc_ctx *c = calloc(1, sizeof *c);
    if (!c) return ks_seterr(eb, KS_ERR_NOMEM, "schema: out of memory");
    c->root = schema;
    c->eb = eb;
    snprintf(c->prefix, sizeof c->prefix, "%s", prefix);
    char root[64], name[64];
    snprintf(root, sizeof root, "%sroot", prefix);
    bool ok = sc_primitives(c) && sc_schema(c, schema, "/", root, name);
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].ref);
    ks_err err = c->err;
    if (ok)
        *gbnf = c->out.p;
    else
        free(c->out.p);
    free(c);
    return ok ? KS_OK : (err ? err : ks_seterr(eb, KS_ERR_INTERNAL, "schema: failed"));
}

ks_err grammar_from_schema(const json_t *schema, grammar **out, ks_errbuf *eb) {
    KS_ASSERT(out);
    *out = NULL;
    char *text = NULL;
    ks_err err = grammar_schema_gbnf(schema, "", &text, eb);
    if (err) return err;
    err = grammar_parse(text, strlen(text), out, eb);
    free(text);
    return err;
}
