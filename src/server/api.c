/* api.c — the pure half of the HTTP API: request JSON -> validated
 * srv_request (OpenAI chat/completions and Workers-AI bodies), error bodies
 * in OpenAI's and Workers AI's shapes, SSE framing and small response
 * helpers. No I/O and no engine calls, so tests/unit/test_server.c covers
 * it all. Validation says which parameter was wrong and why; the JSON text
 * itself is checked by jansson (UTF-8 included: invalid UTF-8 and NUL
 * escapes are malformed JSON, reported with line/column/position). */
#include "server_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ----------------------------------------------------------------------------
// Names

const char *srv_finish_name(engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP:
        return "stop";
    case ENGINE_FINISH_LENGTH:
        return "length";
    default:
        return NULL;
    }
}

// ----------------------------------------------------------------------------
// HTTP framing

/* v without the optional whitespace around it, as [*start, *start + *n). */
static void api__trim(const char *v, const char **start, size_t *n) {
    while (*v == ' ' || *v == '\t')
        v++;
    size_t len = strlen(v);
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    *start = v;
    *n = len;
}

/* True when header value v is exactly token (case-insensitive, OWS trimmed). */
static bool api__token_is(const char *v, const char *token) {
    const char *t;
    size_t n;
    api__trim(v, &t, &n);
    return n == strlen(token) && !strncasecmp(t, token, n);
}

void srv_framing_add(srv_framing *f, const char *name, const char *value) {
    if (!name) return;
    if (!value) value = "";
    if (!strcasecmp(name, "Content-Length")) {
        if (f->n_content_length++ == 0) {
            f->content_length = value;
        } else {
            const char *a, *b;
            size_t na, nb;
            api__trim(f->content_length, &a, &na);
            api__trim(value, &b, &nb);
            if (na != nb || memcmp(a, b, na) != 0) f->content_length_differ = true;
        }
    } else if (!strcasecmp(name, "Transfer-Encoding")) {
        f->n_transfer_encoding++;
        if (!api__token_is(value, "chunked")) f->transfer_encoding = value;
    } else if (!strcasecmp(name, "Content-Encoding")) {
        if (!api__token_is(value, "identity") && !f->content_encoding) f->content_encoding = value;
    } else if (!strcasecmp(name, "Authorization")) {
        f->n_authorization++;
    } else if (!strcasecmp(name, "x-api-key")) {
        f->n_x_api_key++;
    }
}

#define FRAMING(err, reason, ...) srv_refuse(err, reason, NULL, __VA_ARGS__)

bool srv_framing_check(const srv_framing *f, srv_error *err) {
    if (f->content_length_differ)
        return FRAMING(err, ADMIT_BAD_FRAMING,
                       "the request has Content-Length headers with different values");
    if (f->n_content_length && f->n_transfer_encoding)
        return FRAMING(err, ADMIT_BAD_FRAMING,
                       "the request has both Content-Length and Transfer-Encoding; send one");
    if (f->transfer_encoding)
        return FRAMING(err, ADMIT_NOT_IMPLEMENTED,
                       "Transfer-Encoding '%.64s' is not supported: only 'chunked'",
                       f->transfer_encoding);
    if (f->n_transfer_encoding > 1)
        return FRAMING(err, ADMIT_BAD_FRAMING,
                       "the Transfer-Encoding header appears %d times; send it once",
                       f->n_transfer_encoding);
    if (f->content_encoding)
        return FRAMING(err, ADMIT_BAD_ENCODING,
                       "Content-Encoding '%.64s' is not supported: send the body uncompressed",
                       f->content_encoding);
    if (f->n_authorization > 1)
        return FRAMING(err, ADMIT_DUPLICATE_HEADER,
                       "the Authorization header appears %d times; send it once",
                       f->n_authorization);
    if (f->n_x_api_key > 1)
        return FRAMING(err, ADMIT_DUPLICATE_HEADER,
                       "the x-api-key header appears %d times; send it once", f->n_x_api_key);
    return true;
}

/* Where a raw path's model id starts, when the path is a route that takes
 * one as its last part (literally spelled up to it, so percent-decoding
 * cannot move the request to another route): /v1/models/{id},
 * [/client/v4]/accounts/{a}/ai/run/{id} and /admin/models/{id}/{action};
 * *end: where the id ends (the action's literal '/', else the path's end).
 * NULL for any other path. */
static const char *api__model_segment(const char *raw, const char *path_end, const char **end) {
    *end = path_end;
    if (!strncmp(raw, "/v1/models/", 11)) return raw + 11;
    if (!strncmp(raw, "/admin/models/", 14)) {
        const char *slash = NULL; // the action's: the last literal '/'
        for (const char *p = raw + 14; p < path_end; p++)
            if (*p == '/') slash = p;
        if (!slash) return NULL;
        *end = slash;
        return raw + 14;
    }
    const char *acct = !strncmp(raw, "/client/v4/accounts/", 20) ? raw + 20
                       : !strncmp(raw, "/accounts/", 10)         ? raw + 10
                                                                 : NULL;
    const char *slash = acct ? memchr(acct, '/', (size_t)(path_end - acct)) : NULL;
    if (!slash || strncmp(slash, "/ai/run/", 8) != 0) return NULL;
    return slash + 8;
}

bool srv_path_check(const char *raw, srv_error *err) {
    const char *path_end = raw + strcspn(raw, "?"), *id_end;
    const char *id = api__model_segment(raw, path_end, &id_end);
    for (const char *p = raw; p < path_end; p++) {
        if (p[0] != '%' || !p[1] || !p[2]) continue;
        // a slash inside a model id (openai 6.x encodes "org/model" so) stays
        // in that id once decoded; anywhere else it would make another route
        bool in_id = id && p >= id && p + 3 <= id_end;
        if (p[1] == '2' && (p[2] == 'F' || p[2] == 'f') && !in_id)
            return FRAMING(err, ADMIT_INVALID_PATH,
                           "the path may not contain an encoded slash (%%2F) outside a "
                           "model id");
        if (p[1] == '0' && p[2] == '0')
            return FRAMING(err, ADMIT_INVALID_PATH,
                           "the path may not contain an encoded NUL (%%00)");
    }
    return true;
}

#undef FRAMING

// ----------------------------------------------------------------------------
// Request parsing

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

/* Optional integer field in [lo, hi]; *present tells whether it was given. */
static bool api__int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                     bool *present, srv_error *err) {
    json_t *v = json_object_get(root, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v))
        return INVALID(err, key, "'%s' must be an integer, got %s", key, srv_json_type(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return INVALID(err, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    if (present) *present = true;
    return true;
}

static bool api__bool(json_t *root, const char *key, bool *out, srv_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v))
        return INVALID(err, key, "'%s' must be a boolean, got %s", key, srv_json_type(v));
    *out = json_is_true(v);
    return true;
}

/* prediction (OpenAI's predicted outputs): {"type": "content", "content":
 * a string, or an array of {"type": "text", "text": string} parts, joined}.
 * Only a draft source: the output is what it would be without it. */
static bool api__prediction(srv_request *r, json_t *v, srv_error *err) {
    if (!v || json_is_null(v)) return true;
    json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    json_t *c = json_is_object(v) ? json_object_get(v, "content") : NULL;
    if (!t || !json_is_string(t) || strcmp(json_string_value(t), "content") != 0 || !c)
        return INVALID(err, "prediction",
                       "'prediction' must be {\"type\": \"content\", \"content\": ...}");
    size_t n = json_is_array(c) ? json_array_size(c) : 1, len = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_is_array(c) ? json_array_get(c, i) : c;
        json_t *x = json_is_object(p) ? json_object_get(p, "text") : p;
        json_t *pt = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!x || !json_is_string(x) ||
            (json_is_object(p) && (!pt || !json_is_string(pt) ||
                                   strcmp(json_string_value(pt), "text") != 0)))
            return INVALID(err, "prediction",
                           "'prediction.content' must be a string or an array of text parts");
        len += json_string_length(x);
    }
    if (!(r->prediction = malloc(len + 1))) return INVALID(err, "prediction", "out of memory");
    r->prediction_len = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_is_array(c) ? json_array_get(c, i) : c;
        json_t *x = json_is_object(p) ? json_object_get(p, "text") : p;
        memcpy(r->prediction + r->prediction_len, json_string_value(x), json_string_length(x));
        r->prediction_len += json_string_length(x);
    }
    r->prediction[r->prediction_len] = '\0';
    return true;
}

/* prompt: a string, or an array holding exactly one string. */
static bool api__prompt(srv_request *r, json_t *v, srv_error *err) {
    if (json_is_array(v) && json_array_size(v) == 1)
        v = json_array_get(v, 0);
    else if (json_is_array(v))
        return INVALID(err, "prompt",
                       "'prompt' as an array must hold exactly one string (batches "
                       "are not supported), got %zu elements",
                       json_array_size(v));
    if (!json_is_string(v))
        return INVALID(err, "prompt", "'prompt' must be a string, got %s", srv_json_type(v));
    r->prompt = json_string_value(v);
    return true;
}

/* messages: a non-empty array of {role: string, content: string | null (an
 * assistant message with tool_calls) | [{type:
 * "text", text}] }; multi-part text is joined without separators. */
static bool api__messages(srv_request *r, json_t *v, srv_error *err) {
    if (!json_is_array(v))
        return INVALID(err, "messages", "'messages' must be an array, got %s", srv_json_type(v));
    size_t n = json_array_size(v);
    if (n == 0) return INVALID(err, "messages", "'messages' must not be empty");
    r->msgs = calloc(n, sizeof *r->msgs);
    r->owned = calloc(n, sizeof *r->owned);
    if (!r->msgs || !r->owned) return srv_fail(err, 500, "internal_error", "out of memory");
    r->n_msgs = n;
    size_t n_parts = 0; // over every message, bounded by SRV_MAX_CONTENT_PARTS
    for (size_t i = 0; i < n; i++) {
        char pname[64];
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) {
            snprintf(pname, sizeof pname, "messages[%zu]", i);
            return INVALID(err, pname, "'%s' must be an object, got %s", pname, srv_json_type(m));
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) {
            snprintf(pname, sizeof pname, "messages[%zu].role", i);
            return INVALID(err, pname, "'%s' must be a string, got %s", pname,
                           role ? srv_json_type(role) : "nothing");
        }
        r->msgs[i].role = json_string_value(role);
        snprintf(pname, sizeof pname, "messages[%zu].content", i);
        if (json_is_string(content)) {
            r->msgs[i].content = json_string_value(content);
        } else if (json_is_array(content)) {
            size_t total = 0, k;
            json_t *part;
            n_parts += json_array_size(content);
            if (n_parts > SRV_MAX_CONTENT_PARTS)
                return INVALID(err, pname,
                               "the request has more than %d content parts ('%s' reaches it); "
                               "join the text into fewer parts",
                               SRV_MAX_CONTENT_PARTS, pname);
            json_array_foreach(content, k, part) {
                json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) ||
                    strcmp(json_string_value(type), "text") != 0 || !json_is_string(text))
                    return INVALID(err, pname,
                                   "'%s[%zu]' must be {\"type\": \"text\", \"text\": "
                                   "string} (only text parts are supported)",
                                   pname, k);
                total += json_string_length(text);
            }
            char *joined = malloc(total + 1);
            if (!joined) return srv_fail(err, 500, "internal_error", "out of memory");
            size_t off = 0;
            json_array_foreach(content, k, part) {
                json_t *text = json_object_get(part, "text");
                memcpy(joined + off, json_string_value(text), json_string_length(text));
                off += json_string_length(text);
            }
            joined[off] = '\0';
            r->owned[i] = joined;
            r->msgs[i].content = joined;
        } else if (json_is_null(content) && json_object_get(m, "tool_calls") &&
                   !strcmp(r->msgs[i].role, "assistant")) {
            r->msgs[i].content = ""; // an assistant turn that only calls tools
        } else {
            return INVALID(err, pname, "'%s' must be a string or an array of text parts, got %s",
                           pname, content ? srv_json_type(content) : "nothing");
        }
    }
    return true;
}

static bool api__stop(srv_request *r, json_t *v, srv_error *err) {
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return INVALID(err, "stop", "'stop' strings must not be empty");
        r->stops[r->n_stops++] = json_string_value(v);
        return true;
    }
    if (!json_is_array(v))
        return INVALID(err, "stop", "'stop' must be a string or an array of strings, got %s",
                       srv_json_type(v));
    if (json_array_size(v) > SRV_MAX_STOPS)
        return INVALID(err, "stop", "'stop' may hold at most %d strings, got %zu", SRV_MAX_STOPS,
                       json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return INVALID(err, "stop", "'stop[%zu]' must be a string, got %s", i,
                           srv_json_type(s));
        if (json_string_length(s) == 0)
            return INVALID(err, "stop", "'stop[%zu]' must not be empty", i);
        r->stops[r->n_stops++] = json_string_value(s);
    }
    return true;
}

/* logit_bias: an object mapping token ids (decimal strings, as OpenAI's
 * JSON has them) to biases in [-100, 100], at most SAMPLE_MAX_BIAS of them.
 * Whether an id is in the vocabulary is checked by the caller. */
static bool api__logit_bias(srv_request *r, json_t *v, srv_error *err) {
    if (!v || json_is_null(v)) return true;
    if (!json_is_object(v))
        return INVALID(err, "logit_bias",
                       "'logit_bias' must be an object mapping token ids to biases, got %s",
                       srv_json_type(v));
    size_t n = json_object_size(v);
    if (n > SAMPLE_MAX_BIAS)
        return INVALID(err, "logit_bias", "'logit_bias' may hold at most %d entries, got %zu",
                       SAMPLE_MAX_BIAS, n);
    if (n == 0) return true;
    r->bias = calloc(n, sizeof *r->bias);
    if (!r->bias) return srv_fail(err, 500, "internal_error", "out of memory");
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        // a token id: 1 to 10 decimal digits, no sign, no spaces
        size_t len = strlen(key);
        bool digits = len >= 1 && len <= 10;
        for (size_t i = 0; digits && i < len; i++)
            digits = key[i] >= '0' && key[i] <= '9';
        long long id = digits ? strtoll(key, NULL, 10) : -1;
        if (!digits || id > INT32_MAX)
            return INVALID(err, "logit_bias",
                           "'logit_bias' keys must be token ids (non-negative integers), got "
                           "'%.32s'",
                           key);
        if (!json_is_number(b))
            return INVALID(err, "logit_bias", "'logit_bias[%s]' must be a number, got %s", key,
                           srv_json_type(b));
        double d = json_number_value(b);
        if (!(d >= -100 && d <= 100))
            return INVALID(err, "logit_bias", "'logit_bias[%s]' must be in [-100, 100], got %g",
                           key, d);
        r->bias[r->n_bias++] = (sample_bias){(int32_t)id, (float)d};
    }
    return true;
}

/* The sampling fields shared by every route. OpenAI's defaults (temperature
 * 1, no top-k/top-p/min-p truncation, penalties off) unless the route says
 * otherwise: Workers AI documents temperature 0.6. */
static bool api__sampling(srv_request *r, json_t *root, srv_error *err) {
    sample_params *sp = &r->sp;
    sample_params_default(sp);
    sp->temperature = r->route == SRV_ROUTE_WORKERS ? 0.6f : 1.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    long long x = 0;
    bool present;
    if (!api__int(root, "seed", INT64_MIN, INT64_MAX, &x, &present, err)) return false;
    r->seeded = present;
    sp->seed = (uint64_t)x;
    return srv_sampling_read(root, sp, err); // SAMPLE_PARAM_MAP's rows (sampling_json.c)
}

/* The fields each generation route implements (docs/api.md "Request fields"); every
 * other field is refused by name rather than silently ignored, so a client
 * never gets an answer that quietly differs from what it asked for (chat's echo,
 * suffix, tools outside chat, ...). Accepted without an effect on the
 * output, each for a reason: "user" (OpenAI's end-user id for abuse
 * monitoring; kvseal neither uses nor logs it), "stream_options"
 * (include_usage is implemented; its other keys are refused too). Issue
 * 12: "n", "logit_bias" (both routes), "echo" and "best_of" (completions),
 * "response_format" and "grammar" (both), the tool and template fields
 * (chat). Workers AI takes the model from the URL and answers in its own
 * shape, so it has no "model", "n", "user", "stream_options", logit_bias
 * or logprobs. */
static const char *const api__fields_common[] = {
    "max_tokens", /* and the sampler's keys: srv_sampling_known */
    "seed",
    "stop",
    "stream",
    "ignore_eos",
    "logit_bias",
    "prediction",  /* speculative decoding's drafts (OpenAI's predicted outputs) */
    "speculative", /* false: no speculative decoding for this request (kvseal's) */
    "adapter",     /* a LoRA adapter's name (kvseal's; also "model": "base:adapter") */
    NULL,
};
static const char *const api__fields_completions[] = {
    "model",
    "prompt",
    "max_completion_tokens",
    "n",
    "user",
    "stream_options",
    "logprobs",
    "n_probs",
    "echo",
    "best_of",
    "response_format",
    "grammar",
    NULL,
};
static const char *const api__fields_chat[] = {
    "model",
    "messages",
    "max_completion_tokens",
    "n",
    "user",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "tools",
    "chat_template_kwargs",
    "response_format",
    "grammar",
    NULL,
};
/* Chat's tool fields, validated by toolcall_req_parse (toolcall.c). */
static const char *const api__fields_tools[] = {"tools", "tool_choice", "parallel_tool_calls",
                                                NULL};
static const char *const api__fields_workers[] = {"prompt", "messages", "lora", NULL};
/* Workers AI has no logit_bias: the common list's entry does not apply to it. */

/* True when key is in the NULL-terminated set. */
static bool api__in(const char *const *set, const char *key) {
    for (; *set; set++)
        if (!strcmp(*set, key)) return true;
    return false;
}

#define UNSUPPORTED(err, param, ...)                                                               \
    srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, param, __VA_ARGS__)

/* Refuses the first field of the body (or of stream_options, or of a
 * message) that the route does not implement, naming it. */
static bool api__known_fields(srv_route route, json_t *root, srv_error *err) {
    const char *const *own = route == SRV_ROUTE_CHAT          ? api__fields_chat
                             : route == SRV_ROUTE_COMPLETIONS ? api__fields_completions
                                                              : api__fields_workers;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool common = (api__in(api__fields_common, key) || srv_sampling_known(key, false)) &&
                      !(route == SRV_ROUTE_WORKERS && !strcmp(key, "logit_bias"));
        if (common || api__in(own, key)) continue;
        if (route == SRV_ROUTE_CHAT && api__in(api__fields_tools, key)) continue;
        char param[64];
        snprintf(param, sizeof param, "%s", key);
        return UNSUPPORTED(err, param,
                           "Unsupported parameter: '%.64s' is not supported by this server%s", key,
                           route == SRV_ROUTE_WORKERS && !strcmp(key, "model")
                               ? " (the model is the one named in the URL)"
                               : "");
    }
    json_t *so = json_object_get(root, "stream_options");
    if (json_is_object(so)) {
        json_object_foreach(so, key, v) {
            if (!strcmp(key, "include_usage")) continue;
            char param[64];
            snprintf(param, sizeof param, "stream_options.%.40s", key);
            return UNSUPPORTED(err, param,
                               "Unsupported parameter: '%s' is not supported by this "
                               "server",
                               param);
        }
    }
    json_t *msgs = json_object_get(root, "messages"), *m;
    size_t i;
    if (json_is_array(msgs)) {
        json_array_foreach(msgs, i, m) {
            if (!json_is_object(m)) continue; // api__messages says what is wrong with it
            json_object_foreach(m, key, v) {
                if (!strcmp(key, "role") || !strcmp(key, "content") || srv_chat_message_key_ok(key))
                    continue;
                char param[64];
                snprintf(param, sizeof param, "messages[%zu].%.32s", i, key);
                return UNSUPPORTED(err, param,
                                   "Unsupported parameter: '%s' is not supported by this server "
                                   "(a message has role, content, name, tool_calls, "
                                   "tool_call_id and reasoning_content)",
                                   param);
            }
        }
    }
    return true;
}

#undef UNSUPPORTED

bool srv_request_parse(srv_route route, const char *body, size_t len, srv_request *r,
                       srv_error *err) {
    memset(r, 0, sizeof *r);
    r->route = route;
    r->max_tokens = -1;
    json_error_t je;
    // JSON_REJECT_DUPLICATES: {"model": "a", "model": "b"} is ambiguous, refuse it
    r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->root) {
        srv_refuse(err, ADMIT_INVALID_JSON, NULL,
                   "malformed JSON at line %d, column %d (position %d): %s", je.line, je.column,
                   je.position, je.text);
        return false;
    }
    json_t *root = r->root;
    if (!json_is_object(root)) {
        INVALID(err, NULL, "the request body must be a JSON object, got %s", srv_json_type(root));
        goto fail;
    }
    if (!api__known_fields(route, root, err)) goto fail;
    json_t *v;
    if ((v = json_object_get(root, "model")) && !json_is_null(v)) {
        if (!json_is_string(v)) {
            INVALID(err, "model", "'model' must be a string, got %s", srv_json_type(v));
            goto fail;
        }
        r->model = json_string_value(v);
    }
    // the LoRA adapter: "adapter" (kvseal's), or Workers AI's "lora" on its route
    const char *akey = route == SRV_ROUTE_WORKERS && json_object_get(root, "lora") ? "lora"
                                                                                   : "adapter";
    if (route == SRV_ROUTE_WORKERS && json_object_get(root, "lora") &&
        json_object_get(root, "adapter")) {
        INVALID(err, "lora", "give the adapter as 'lora' or 'adapter', not both");
        goto fail;
    }
    if ((v = json_object_get(root, akey)) && !json_is_null(v)) {
        if (!json_is_string(v) || !json_string_length(v)) {
            INVALID(err, akey, "'%s' must be a non-empty string (an adapter's name), got %s", akey,
                    json_is_string(v) ? "an empty string" : srv_json_type(v));
            goto fail;
        }
        r->adapter = json_string_value(v);
    }
    json_t *prompt = json_object_get(root, "prompt"), *msgs = json_object_get(root, "messages");
    if (prompt && json_is_null(prompt)) prompt = NULL;
    if (msgs && json_is_null(msgs)) msgs = NULL;
    switch (route) {
    case SRV_ROUTE_CHAT:
        if (!msgs) {
            srv_refuse(err, ADMIT_MISSING_PARAMETER, "messages", "'messages' is required");
            goto fail;
        }
        if (!api__messages(r, msgs, err)) goto fail;
        if (!toolcall_req_parse(root, &r->tc, err) || !srv_chat_prepare(r, root, err)) goto fail;
        break;
    case SRV_ROUTE_COMPLETIONS:
        if (!prompt) {
            srv_refuse(err, ADMIT_MISSING_PARAMETER, "prompt", "'prompt' is required");
            goto fail;
        }
        if (!api__prompt(r, prompt, err)) goto fail;
        break;
    case SRV_ROUTE_WORKERS:
        if (!prompt == !msgs) {
            INVALID(err, prompt ? "prompt" : NULL,
                    "exactly one of 'prompt' and 'messages' is required");
            goto fail;
        }
        if (prompt ? !api__prompt(r, prompt, err) : !api__messages(r, msgs, err)) goto fail;
        if (msgs && !srv_chat_prepare(r, root, err)) goto fail;
        break;
    default:
        KS_ASSERT(!"srv_request_parse: not a generation route");
    }

    // max_tokens (max_completion_tokens is OpenAI's newer name; it wins)
    long long mt = -1;
    bool present;
    if (!api__bool(root, "echo", &r->echo, err)) goto fail;
    // max_tokens 0 only with echo (lm-evaluation-harness scores the prompt)
    if (!api__int(root, "max_tokens", r->echo ? 0 : 1, SRV_MAX_TOKENS_LIMIT, &mt, &present, err))
        goto fail;
    if (!api__int(root, "max_completion_tokens", r->echo ? 0 : 1, SRV_MAX_TOKENS_LIMIT, &mt,
                  &present, err))
        goto fail;
    r->max_tokens = (int32_t)mt;
    long long n = 1, best_of = -1;
    if (!api__int(root, "n", 1, ENGINE_MAX_N, &n, NULL, err)) goto fail;
    if (!api__int(root, "best_of", 1, ENGINE_MAX_N, &best_of, &present, err)) goto fail;
    r->n = (int)n;
    r->best_of = present ? (int)best_of : r->n;
    if (r->best_of < r->n) {
        INVALID(err, "best_of", "'best_of' must be >= 'n' (%d), got %d", r->n, r->best_of);
        goto fail;
    }
    if (!api__logit_bias(r, json_object_get(root, "logit_bias"), err)) goto fail;
    if (!api__sampling(r, root, err)) goto fail;
    if (r->max_tokens >= 0 && r->sp.min_tokens > r->max_tokens) { // vLLM: both given
        INVALID(err, "min_tokens", "'min_tokens' must be <= 'max_tokens' (%d), got %d",
                (int)r->max_tokens, (int)r->sp.min_tokens);
        goto fail;
    }
    if (!api__stop(r, json_object_get(root, "stop"), err)) goto fail;
    if (!api__bool(root, "stream", &r->stream, err)) goto fail;
    if (r->stream && r->best_of > r->n) { // the best are known only at the end (OpenAI: same)
        INVALID(err, "best_of", "'best_of' > 'n' cannot be streamed; set stream to false");
        goto fail;
    }
    if (!api__bool(root, "ignore_eos", &r->ignore_eos, err)) goto fail;
    bool spec = true;
    if (!api__bool(root, "speculative", &spec, err)) goto fail;
    r->no_spec = !spec;
    if (!api__prediction(r, json_object_get(root, "prediction"), err)) goto fail;
    if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v)) {
            INVALID(err, "stream_options", "'stream_options' must be an object, got %s",
                    srv_json_type(v));
            goto fail;
        }
        if (!api__bool(v, "include_usage", &r->include_usage, err)) goto fail;
    }

    // logprobs: a boolean (+ top_logprobs) for chat, an integer for completions
    v = json_object_get(root, "logprobs");
    if (route == SRV_ROUTE_COMPLETIONS) {
        long long k = 0;
        if (!api__int(root, "logprobs", 0, SAMPLE_MAX_TOP, &k, &present, err)) goto fail;
        if (!present && !api__int(root, "n_probs", 0, SAMPLE_MAX_TOP, &k, &present, err)) goto fail;
        r->logprobs = present;
        r->top_logprobs = (int)k;
    } else {
        if (!api__bool(root, "logprobs", &r->logprobs, err)) goto fail;
        long long k = 0;
        if (!api__int(root, "top_logprobs", 0, SAMPLE_MAX_TOP, &k, &present, err)) goto fail;
        if (present && !r->logprobs) {
            INVALID(err, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
            goto fail;
        }
        r->top_logprobs = (int)k;
    }
    if ((v = json_object_get(root, "user")) && !json_is_null(v) && !json_is_string(v)) {
        INVALID(err, "user", "'user' must be a string, got %s", srv_json_type(v));
        goto fail;
    }
    // OpenAI requires a model (checked last: other mistakes say more);
    // Workers AI has it in the URL
    if (!r->model && route != SRV_ROUTE_WORKERS) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "model", "you must provide a model parameter");
        goto fail;
    }
    r->sp.logprobs = r->logprobs || r->best_of > r->n; // best_of ranks by logprobs
    r->sp.n_probs = r->top_logprobs;
    // last: compiling a grammar is the most work, and other mistakes say more
    if (route != SRV_ROUTE_WORKERS && !srv_request_format(r, root, err)) goto fail;
    return true;
fail:
    srv_request_free(r);
    return false;
}

void srv_request_free(srv_request *r) {
    if (r->owned)
        for (size_t i = 0; i < r->n_msgs; i++)
            free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    if (r->tmpl_msgs) json_decref(r->tmpl_msgs);
    grammar_unref(r->grammar);
    free(r->bias);
    free(r->prediction);
    if (r->root) json_decref(r->root);
    memset(r, 0, sizeof *r);
}

// ----------------------------------------------------------------------------
// Context length before tokenizing

int64_t srv_prompt_min_tokens(size_t text_bytes, size_t max_token_bytes) {
    if (!max_token_bytes) return 0;
    return (int64_t)((text_bytes + max_token_bytes - 1) / max_token_bytes);
}

bool srv_prompt_fits(int32_t n_ctx, size_t text_bytes, size_t max_token_bytes, int32_t max_tokens,
                     srv_route route, srv_error *err) {
    // Only a prompt that cannot fit by itself is refused here: anything
    // shorter than n_ctx * max_token_bytes bytes is cheap enough to tokenize,
    // and gets the engine's exact numbers (max_tokens too large, say).
    int64_t lo = srv_prompt_min_tokens(text_bytes, max_token_bytes);
    int64_t mt = max_tokens > 0 ? max_tokens : 1;
    if (lo + 1 <= n_ctx) return true;
    // the same reason as the engine's exact refusal (admit_lengths)
    return srv_refuse(
        err, ADMIT_CONTEXT_LENGTH, route == SRV_ROUTE_COMPLETIONS ? "prompt" : "messages",
        "This model's maximum context length is %d tokens. However, you "
        "requested at least %lld tokens (at least %lld in the prompt of %zu "
        "bytes, at most %zu bytes per token, %lld for the completion). Please "
        "reduce the length of the prompt or completion.",
        n_ctx, (long long)(lo + mt), (long long)lo, text_bytes, max_token_bytes, (long long)mt);
}

// ----------------------------------------------------------------------------
// Responses and SSE

bool srv_sse_json(srv_buf *b, const json_t *j) {
    // compact JSON never contains a raw newline (strings escape it), so one
    // data: line per event is always well-framed
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s) return false;
    bool ok =
        srv_buf_add(b, "data: ", 6) && srv_buf_add(b, s, strlen(s)) && srv_buf_add(b, "\n\n", 2);
    free(s);
    return ok;
}

bool srv_sse_done(srv_buf *b) { return srv_buf_add(b, "data: [DONE]\n\n", 14); }

json_t *srv_usage_json(const engine_event *t) {
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)t->n_prompt,
                          "completion_tokens", (int)t->n_gen, "total_tokens",
                          (int)(t->n_prompt + t->n_gen), "prompt_tokens_details", "cached_tokens",
                          (int)t->n_cached);
    // speculative decoding (OpenAI's names for its predicted outputs): drafts
    // kept, and drafts computed but not kept
    if (u && t->n_drafted > 0 &&
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:i, s:i}", "accepted_prediction_tokens",
                                      (int)t->n_accepted, "rejected_prediction_tokens",
                                      (int)(t->n_drafted - t->n_accepted))) != 0) {
        json_decref(u);
        return NULL;
    }
    return u;
}
