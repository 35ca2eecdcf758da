/* api_embed.c — the bodies of POST /v1/embeddings, /tokenize and
 * /detokenize (server_int.h, "Embeddings, tokenize, detokenize"): parsing
 * with precise 400s, and the answers in OpenAI's and llama.cpp server's
 * shapes. Pure: no model code, no I/O; http.c does the rest (auth, tenant
 * limits, the backend's embed_submit, waiting). */
#include "server_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

static const char *emb__type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static json_t *emb__load(const char *body, size_t len, srv_error *err) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        srv_refuse(err, ADMIT_INVALID_JSON, NULL,
                   "malformed JSON at line %d, column %d (position %d): %s", je.line, je.column,
                   je.position, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        INVALID(err, NULL, "the request body must be a JSON object, got %s", emb__type(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Fields of root other than those in known (NULL-terminated) are refused:
 * a misspelt option must not be silently ignored. */
static bool emb__known(json_t *root, const char *const *known, srv_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(key, known[i]);
        if (!ok)
            return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, key, "unknown parameter '%s'", key);
    }
    return true;
}

static bool emb__bool(json_t *root, const char *key, bool *out, srv_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v))
        return INVALID(err, key, "'%s' must be a boolean, got %s", key, emb__type(v));
    *out = json_is_true(v);
    return true;
}

/* An array of token ids into a malloc'd array (*ids NULL when empty).
 * what names it in errors ("input[2]", "tokens"). */
static bool emb__ids(json_t *a, const char *param, const char *what, int32_t **ids, size_t *n,
                     srv_error *err) {
    *ids = NULL;
    *n = json_array_size(a);
    if (*n == 0) return true;
    if (!(*ids = malloc(sizeof(int32_t) * *n))) {
        srv_fail(err, 500, "internal_error", "out of memory");
        return false;
    }
    for (size_t i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, i);
        json_int_t t = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || t < 0 || t > INT32_MAX) {
            free(*ids);
            *ids = NULL;
            if (json_is_integer(v))
                return INVALID(err, param, "%s[%zu]: token id %lld is out of range", what, i,
                               (long long)t);
            return INVALID(err, param, "%s[%zu] must be a token id (an integer), got %s", what, i,
                           emb__type(v));
        }
        (*ids)[i] = (int32_t)t;
    }
    return true;
}

// ----------------------------------------------------------------------------
// POST /v1/embeddings

void srv_embed_req_free(srv_embed_req *r) {
    for (int i = 0; r->in && i < r->n; i++)
        free(r->in[i].ids);
    free(r->in);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

bool srv_embed_parse(const char *body, size_t len, srv_embed_req *r, srv_error *err) {
    static const char *const known[] = {"input",      "model", "encoding_format",
                                        "dimensions", "user",  NULL};
    memset(r, 0, sizeof *r);
    r->dimensions = -1;
    if (!(r->root = emb__load(body, len, err))) return false;
    json_t *root = r->root, *v;
    if (!emb__known(root, known, err)) goto fail;
    if ((v = json_object_get(root, "model")) && !json_is_null(v)) {
        if (!json_is_string(v)) {
            INVALID(err, "model", "'model' must be a string, got %s", emb__type(v));
            goto fail;
        }
        r->model = json_string_value(v);
    }
    if ((v = json_object_get(root, "encoding_format")) && !json_is_null(v)) {
        const char *f = json_is_string(v) ? json_string_value(v) : NULL;
        if (!f || (strcmp(f, "float") && strcmp(f, "base64"))) {
            INVALID(err, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
            goto fail;
        }
        r->base64 = !strcmp(f, "base64");
    }
    if ((v = json_object_get(root, "dimensions")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            INVALID(err, "dimensions", "'dimensions' must be a positive integer");
            goto fail;
        }
        r->dimensions = (int64_t)json_integer_value(v);
    }
    if ((v = json_object_get(root, "user")) && !json_is_null(v) && !json_is_string(v)) {
        INVALID(err, "user", "'user' must be a string, got %s", emb__type(v));
        goto fail;
    }
    json_t *in = json_object_get(root, "input");
    if (!in || json_is_null(in)) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "input", "'input' is required");
        goto fail;
    }
    // a string; an array of strings; an array of ids; an array of arrays of ids
    bool one = json_is_string(in) || (json_is_array(in) && json_array_size(in) > 0 &&
                                      json_is_integer(json_array_get(in, 0)));
    if (!json_is_string(in) && !json_is_array(in)) {
        INVALID(err, "input",
                "'input' must be a string, an array of strings, an array of token ids or an "
                "array of arrays of token ids, got %s",
                emb__type(in));
        goto fail;
    }
    size_t n = one ? 1 : json_array_size(in);
    if (n == 0) {
        INVALID(err, "input", "'input' is empty");
        goto fail;
    }
    if (n > SRV_EMBED_MAX_INPUTS) {
        INVALID(err, "input", "'input' has %zu entries; at most %d per request", n,
                SRV_EMBED_MAX_INPUTS);
        goto fail;
    }
    if (!(r->in = calloc(n, sizeof *r->in))) {
        srv_fail(err, 500, "internal_error", "out of memory");
        goto fail;
    }
    r->n = (int)n;
    bool kind_ids = false;
    for (size_t i = 0; i < n; i++) {
        json_t *e = one ? in : json_array_get(in, i);
        srv_embed_input *x = &r->in[i];
        char what[32];
        snprintf(what, sizeof what, one ? "input" : "input[%zu]", i);
        if (i > 0 && kind_ids != json_is_array(e)) {
            INVALID(err, "input",
                    "%s: the entries of 'input' must all be strings or all be "
                    "arrays of token ids",
                    what);
            goto fail;
        }
        kind_ids = json_is_array(e);
        if (json_is_string(e)) {
            x->text = json_string_value(e);
            x->len = json_string_length(e);
            if (x->len == 0) {
                INVALID(err, "input", "%s is an empty string", what);
                goto fail;
            }
        } else if (json_is_array(e)) {
            x->is_ids = true;
            if (!emb__ids(e, "input", what, &x->ids, &x->n_ids, err)) goto fail;
            if (x->n_ids == 0) {
                INVALID(err, "input", "%s is an empty array of token ids", what);
                goto fail;
            }
        } else {
            INVALID(err, "input", "%s must be a string or an array of token ids, got %s", what,
                    emb__type(e));
            goto fail;
        }
    }
    return true;
fail:
    srv_embed_req_free(r);
    return false;
}

json_t *srv_embed_answer(const float *vecs, int n, int32_t E, bool base64, const char *model_name,
                         int64_t prompt_tokens) {
    json_t *data = json_array();
    if (!data) return NULL;
    char *b64 = NULL;
    size_t b64_cap = 0;
    if (base64) { // little-endian f32, as OpenAI's clients decode it
        b64_cap =
            sodium_base64_encoded_len(sizeof(float) * (size_t)E, sodium_base64_VARIANT_ORIGINAL);
        if (!(b64 = malloc(b64_cap))) goto fail;
    }
    for (int i = 0; i < n; i++) {
        const float *v = vecs + (size_t)i * (size_t)E;
        json_t *emb;
        if (base64) {
            unsigned char *le = malloc(sizeof(float) * (size_t)E);
            if (!le) goto fail;
            for (int32_t k = 0; k < E; k++) {
                uint32_t u;
                memcpy(&u, &v[k], 4);
                le[4 * k] = (unsigned char)u, le[4 * k + 1] = (unsigned char)(u >> 8);
                le[4 * k + 2] = (unsigned char)(u >> 16), le[4 * k + 3] = (unsigned char)(u >> 24);
            }
            sodium_bin2base64(b64, b64_cap, le, sizeof(float) * (size_t)E,
                              sodium_base64_VARIANT_ORIGINAL);
            free(le);
            emb = json_string(b64);
        } else {
            emb = json_array();
            for (int32_t k = 0; emb && k < E; k++)
                if (json_array_append_new(emb, json_real((double)v[k]))) {
                    json_decref(emb);
                    emb = NULL;
                }
        }
        json_t *o =
            emb ? json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", i, "embedding", emb)
                : NULL;
        if (!o || json_array_append_new(data, o)) goto fail;
    }
    free(b64);
    return json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                     model_name, "usage", "prompt_tokens", (json_int_t)prompt_tokens,
                     "total_tokens", (json_int_t)prompt_tokens);
fail:
    free(b64);
    json_decref(data);
    return NULL;
}

// ----------------------------------------------------------------------------
// POST /tokenize and /detokenize (llama.cpp server's shapes)

bool srv_tokenize_parse(const char *body, size_t len, srv_tokenize_req *r, srv_error *err) {
    static const char *const known[] = {"content",     "add_special", "parse_special",
                                        "with_pieces", "model",       NULL};
    memset(r, 0, sizeof *r);
    if (!(r->root = emb__load(body, len, err))) return false;
    json_t *c = json_object_get(r->root, "content"), *m;
    if (!emb__known(r->root, known, err)) goto fail;
    if (!c || json_is_null(c)) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "content", "'content' is required");
        goto fail;
    }
    if (!json_is_string(c)) {
        INVALID(err, "content", "'content' must be a string, got %s", emb__type(c));
        goto fail;
    }
    r->content = json_string_value(c);
    r->len = json_string_length(c);
    if ((m = json_object_get(r->root, "model")) && !json_is_null(m)) {
        if (!json_is_string(m)) {
            INVALID(err, "model", "'model' must be a string, got %s", emb__type(m));
            goto fail;
        }
        r->model = json_string_value(m);
    }
    if (!emb__bool(r->root, "add_special", &r->add_special, err) ||
        !emb__bool(r->root, "parse_special", &r->parse_special, err) ||
        !emb__bool(r->root, "with_pieces", &r->with_pieces, err))
        goto fail;
    return true;
fail:
    json_decref(r->root);
    r->root = NULL;
    return false;
}

/* A piece as JSON: a string when it is valid UTF-8, else its bytes (as
 * llama.cpp's server answers a piece that splits a character). */
static json_t *emb__piece(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);
    if (s) return s;
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((unsigned char)p[i]))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

json_t *srv_tokenize_answer(const tok_vocab *v, const int32_t *ids, size_t n, bool with_pieces) {
    json_t *toks = json_array();
    size_t cap = tok_max_piece(v) + 1;
    char *buf = with_pieces ? malloc(cap) : NULL;
    if (!toks || (with_pieces && !buf)) goto fail;
    for (size_t i = 0; i < n; i++) {
        json_t *t;
        if (with_pieces) {
            size_t k = tok_piece(v, ids[i], true, buf, cap);
            json_t *piece = emb__piece(buf, k < cap ? k : cap);
            t = piece ? json_pack("{s:i, s:o}", "id", (int)ids[i], "piece", piece) : NULL;
        } else {
            t = json_integer(ids[i]);
        }
        if (!t || json_array_append_new(toks, t)) goto fail;
    }
    free(buf);
    return json_pack("{s:o}", "tokens", toks);
fail:
    free(buf);
    json_decref(toks);
    return NULL;
}

bool srv_detokenize_parse(const char *body, size_t len, int32_t n_vocab, int32_t **ids, size_t *n,
                          const char **model_name, json_t **root, srv_error *err) {
    static const char *const known[] = {"tokens", "model", NULL};
    *ids = NULL;
    *n = 0;
    *model_name = NULL;
    if (!(*root = emb__load(body, len, err))) return false;
    json_t *t = json_object_get(*root, "tokens"), *m;
    if (!emb__known(*root, known, err)) goto fail;
    if (!t || json_is_null(t)) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "tokens", "'tokens' is required");
        goto fail;
    }
    if (!json_is_array(t)) {
        INVALID(err, "tokens", "'tokens' must be an array of token ids, got %s", emb__type(t));
        goto fail;
    }
    if ((m = json_object_get(*root, "model")) && !json_is_null(m)) {
        if (!json_is_string(m)) {
            INVALID(err, "model", "'model' must be a string, got %s", emb__type(m));
            goto fail;
        }
        *model_name = json_string_value(m);
    }
    if (!emb__ids(t, "tokens", "tokens", ids, n, err)) goto fail;
    for (size_t i = 0; i < *n; i++)
        if ((*ids)[i] >= n_vocab) {
            INVALID(err, "tokens",
                    "tokens[%zu]: token id %d is out of range: the vocabulary has %d "
                    "tokens",
                    i, (int)(*ids)[i], (int)n_vocab);
            free(*ids);
            *ids = NULL;
            goto fail;
        }
    return true;
fail:
    json_decref(*root);
    *root = NULL;
    return false;
}
