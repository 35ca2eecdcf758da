/* anthropic.c — Anthropic's Messages API (POST /v1/messages) as coding
 * agents use it against local servers, translated onto the chat machinery
 * (anthropic.h). A request becomes the OpenAI chat request it means and
 * goes through the same validation, chat template, tool-call grammar and
 * parser as /v1/chat/completions; only the edges differ: the request's
 * shape (system apart, content blocks, tool_result in user turns) and the
 * answer's (content blocks, stop_reason, named SSE events, the error body).
 *
 * Fields follow docs.anthropic.com's Messages reference. What kvseal cannot
 * honour is refused by name (images, documents, server tools, a trailing
 * assistant message to continue), never silently dropped; metadata and
 * cache_control are accepted and have no effect (prefix caching is
 * automatic and per tenant, docs/design.md I7). */
#include "anthropic.h"

#include "server_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

// ----------------------------------------------------------------------------
// Requests

static bool anth__in(const char *const *set, const char *s) {
    for (; *set; set++)
        if (!strcmp(*set, s)) return true;
    return false;
}

/* The request fields this route implements (docs/api.md "Anthropic Messages and Workers AI"). */
static const char *const anth__fields[] = {
    "model",  "messages",    "system",   "max_tokens", "stop_sequences", "stream",
    "tools",  "tool_choice", "thinking", "metadata",   NULL, /* + srv_sampling_known(k, true) */
};

/* The block's "type" or NULL (err filled) when it is no object with a
 * string type; pname names the block. */
static const char *anth__block_type(json_t *b, const char *pname, srv_error *err) {
    json_t *t = json_object_get(b, "type");
    if (!json_is_object(b) || !json_is_string(t)) {
        INVALID(err, pname, "%s: must be an object with a string 'type'", pname);
        return NULL;
    }
    return json_string_value(t);
}

/* Checks a block's keys against keys (plus type and cache_control). */
static bool anth__block_keys(json_t *b, const char *const *keys, const char *pname,
                             srv_error *err) {
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        if (!strcmp(k, "type") || !strcmp(k, "cache_control") || anth__in(keys, k)) continue;
        return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                          "%s.%.40s: Extra inputs are not permitted", pname, k);
    }
    return true;
}

/* Text joined from blocks: a growing buffer, so k blocks cost time linear
 * in their total size (a JSON string rebuilt per block was quadratic). */
typedef struct anth_text {
    srv_buf b;
    bool any; /* a piece was added (an empty one counts) */
} anth_text;

/* Appends text to acc with sep between pieces. False on out-of-memory. */
static bool anth__join(anth_text *acc, const char *text, size_t n, const char *sep) {
    if (acc->any && !srv_buf_add(&acc->b, sep, strlen(sep))) return false;
    acc->any = true;
    return srv_buf_add(&acc->b, n ? text : "", n);
}

/* acc as a new JSON string into *out (NULL when nothing was added); frees
 * acc's buffer. False on out-of-memory. */
static bool anth__text_take(anth_text *acc, json_t **out) {
    *out = acc->any ? json_stringn_nocheck(acc->b.p ? acc->b.p : "", acc->b.len) : NULL;
    bool ok = !acc->any || *out;
    srv_buf_free(&acc->b);
    acc->any = false;
    return ok;
}

/* Counts n more content blocks against the request's bound
 * (SRV_MAX_CONTENT_PARTS); false with a 400 past it. */
static bool anth__count_parts(size_t *n_parts, size_t n, const char *pname, srv_error *err) {
    *n_parts += n;
    if (*n_parts <= SRV_MAX_CONTENT_PARTS) return true;
    return INVALID(err, pname,
                   "%s: the request has more than %d content blocks; join the text into fewer "
                   "blocks",
                   pname, SRV_MAX_CONTENT_PARTS);
}

/* Text blocks (or a string) as one string joined by "\n", into *out (new
 * reference); a tool_result's content and system use it. */
static bool anth__text_of(json_t *v, const char *pname, json_t **out, size_t *n_parts,
                          srv_error *err) {
    *out = NULL;
    anth_text acc = {0};
    if (json_is_string(v)) {
        *out = json_incref(v);
        return true;
    }
    if (!json_is_array(v)) {
        INVALID(err, pname, "%s: must be a string or an array of text blocks, got %s", pname,
                srv_json_kind(v));
        return false;
    }
    size_t k;
    json_t *b;
    char bname[96];
    if (!anth__count_parts(n_parts, json_array_size(v), pname, err)) return false;
    json_array_foreach(v, k, b) {
        snprintf(bname, sizeof bname, "%s.%zu", pname, k);
        const char *type = anth__block_type(b, bname, err);
        if (!type) goto fail;
        if (strcmp(type, "text") != 0) {
            srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, bname,
                       "%s.type: '%.32s' blocks are not supported here: only text", bname, type);
            goto fail;
        }
        static const char *const keys[] = {"text", "citations", NULL};
        json_t *t = json_object_get(b, "text");
        if (!anth__block_keys(b, keys, bname, err)) goto fail;
        if (!json_is_string(t)) {
            INVALID(err, bname, "%s.text: must be a string", bname);
            goto fail;
        }
        if (!anth__join(&acc, json_string_value(t), json_string_length(t), "\n")) goto oom;
    }
    if (!anth__text_take(&acc, out)) goto oom;
    if (!*out && !(*out = json_string(""))) goto oom;
    return true;
oom:
    srv_fail(err, 500, "internal_error", "out of memory");
fail:
    srv_buf_free(&acc.b);
    json_decref(*out);
    *out = NULL;
    return false;
}

/* A user turn's blocks: tool_result blocks become tool messages (in order),
 * the text blocks one user message after them. */
static bool anth__user(json_t *msgs, json_t *content, size_t i, size_t *n_parts,
                       srv_error *err) {
    char pname[96];
    json_t *text = NULL;
    anth_text acc = {0};
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b) {
        snprintf(pname, sizeof pname, "messages.%zu.content.%zu", i, k);
        const char *type = anth__block_type(b, pname, err);
        if (!type) goto fail;
        if (!strcmp(type, "text")) {
            static const char *const keys[] = {"text", "citations", NULL};
            json_t *t = json_object_get(b, "text");
            if (!anth__block_keys(b, keys, pname, err)) goto fail;
            if (!json_is_string(t)) {
                INVALID(err, pname, "%s.text: must be a string", pname);
                goto fail;
            }
            if (!anth__join(&acc, json_string_value(t), json_string_length(t), "\n")) goto oom;
        } else if (!strcmp(type, "tool_result")) {
            static const char *const keys[] = {"tool_use_id", "content", "is_error", NULL};
            if (!anth__block_keys(b, keys, pname, err)) goto fail;
            json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
            json_t *ie = json_object_get(b, "is_error");
            if (!json_is_string(id) || !json_string_length(id)) {
                INVALID(err, pname, "%s.tool_use_id: must be a non-empty string", pname);
                goto fail;
            }
            if (ie && !json_is_boolean(ie)) {
                INVALID(err, pname, "%s.is_error: must be a boolean", pname);
                goto fail;
            }
            json_t *ct = NULL;
            char cname[112];
            snprintf(cname, sizeof cname, "%s.content", pname);
            if (!c || json_is_null(c))
                ct = json_string("");
            else if (!anth__text_of(c, cname, &ct, n_parts, err))
                goto fail;
            if (!ct) goto oom;
            if (json_is_true(ie)) { // the template has no error flag: say it in the text
                anth_text pre = {0};
                bool ok = anth__join(&pre, "Error: ", 7, "") &&
                          anth__join(&pre, json_string_value(ct), json_string_length(ct), "");
                json_decref(ct);
                ct = NULL;
                if (!ok || !anth__text_take(&pre, &ct)) {
                    srv_buf_free(&pre.b);
                    json_decref(ct);
                    goto oom;
                }
            }
            json_t *m =
                json_pack("{s:s, s:o, s:O}", "role", "tool", "content", ct, "tool_call_id", id);
            if (!m || json_array_append_new(msgs, m)) goto oom;
        } else {
            srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                       "%s.type: '%.32s' blocks are not supported in user messages%s", pname, type,
                       !strcmp(type, "image") || !strcmp(type, "document")
                           ? " (this server's model reads text only)"
                           : " (text and tool_result are)");
            goto fail;
        }
    }
    if (!anth__text_take(&acc, &text)) goto oom;
    if (text) {
        json_t *m = json_pack("{s:s, s:o}", "role", "user", "content", text);
        text = NULL;
        if (!m || json_array_append_new(msgs, m)) goto oom;
    }
    return true;
oom:
    srv_fail(err, 500, "internal_error", "out of memory");
fail:
    srv_buf_free(&acc.b);
    json_decref(text);
    return false;
}

/* An assistant turn's blocks: text -> content, thinking -> reasoning_content,
 * tool_use -> tool_calls (input as JSON text, as OpenAI sends arguments). */
static bool anth__assistant(json_t *msgs, json_t *content, size_t i, srv_error *err) {
    char pname[96];
    json_t *text = NULL, *think = NULL, *calls = NULL;
    anth_text tacc = {0}, hacc = {0};
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b) {
        snprintf(pname, sizeof pname, "messages.%zu.content.%zu", i, k);
        const char *type = anth__block_type(b, pname, err);
        if (!type) goto fail;
        if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            bool th = type[1] == 'h';
            static const char *const tkeys[] = {"text", "citations", NULL};
            static const char *const hkeys[] = {"thinking", "signature", NULL};
            json_t *t = json_object_get(b, th ? "thinking" : "text");
            if (!anth__block_keys(b, th ? hkeys : tkeys, pname, err)) goto fail;
            if (!json_is_string(t)) {
                INVALID(err, pname, "%s.%s: must be a string", pname, th ? "thinking" : "text");
                goto fail;
            }
            if (!anth__join(th ? &hacc : &tacc, json_string_value(t), json_string_length(t), "\n"))
                goto oom;
        } else if (!strcmp(type, "redacted_thinking")) {
            continue; // opaque to any model but the one that wrote it
        } else if (!strcmp(type, "tool_use")) {
            static const char *const keys[] = {"id", "name", "input", NULL};
            if (!anth__block_keys(b, keys, pname, err)) goto fail;
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name)) {
                INVALID(err, pname, "%s: 'id' and 'name' must be strings", pname);
                goto fail;
            }
            if (!json_is_object(input)) {
                INVALID(err, pname, "%s.input: must be an object, got %s", pname,
                        input ? srv_json_kind(input) : "nothing");
                goto fail;
            }
            char *args = json_dumps(input, JSON_COMPACT | JSON_SORT_KEYS);
            json_t *c = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                         "function", "name", name, "arguments", args)
                             : NULL;
            free(args);
            if (!calls && !(calls = json_array())) {
                json_decref(c);
                goto oom;
            }
            if (!c || json_array_append_new(calls, c)) goto oom;
        } else {
            srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                       "%s.type: '%.32s' blocks are not supported in assistant messages (text, "
                       "thinking, redacted_thinking and tool_use are)",
                       pname, type);
            goto fail;
        }
    }
    if (!anth__text_take(&tacc, &text) || !anth__text_take(&hacc, &think)) goto oom;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!m) goto oom;
    json_object_set_new(m, "content", text ? text : calls ? json_null() : json_string(""));
    if (think) json_object_set_new(m, "reasoning_content", think);
    if (calls) json_object_set_new(m, "tool_calls", calls);
    return json_array_append_new(msgs, m) == 0
               ? true
               : srv_fail(err, 500, "internal_error", "out of memory");
oom:
    srv_fail(err, 500, "internal_error", "out of memory");
fail:
    srv_buf_free(&tacc.b);
    srv_buf_free(&hacc.b);
    json_decref(text);
    json_decref(think);
    json_decref(calls);
    return false;
}

static bool anth__messages(json_t *out, json_t *root, srv_error *err) {
    json_t *msgs = json_array(), *sys = json_object_get(root, "system");
    size_t n_parts = 0; // content blocks, bounded by SRV_MAX_CONTENT_PARTS
    json_object_set_new(out, "messages", msgs);
    if (!msgs) return srv_fail(err, 500, "internal_error", "out of memory");
    if (sys && !json_is_null(sys)) {
        json_t *st;
        if (!anth__text_of(sys, "system", &st, &n_parts, err)) return false;
        if (json_string_length(st) == 0)
            json_decref(st);
        else if (json_array_append_new(msgs,
                                       json_pack("{s:s, s:o}", "role", "system", "content", st)))
            return srv_fail(err, 500, "internal_error", "out of memory");
    }
    json_t *in = json_object_get(root, "messages");
    if (!in)
        return srv_refuse(err, ADMIT_MISSING_PARAMETER, "messages", "messages: Field required");
    if (!json_is_array(in) || json_array_size(in) == 0)
        return INVALID(err, "messages", "messages: must be a non-empty array, got %s",
                       json_is_array(in) ? "an empty one" : srv_json_kind(in));
    size_t i, n = json_array_size(in);
    json_t *m;
    char pname[64];
    json_array_foreach(in, i, m) {
        snprintf(pname, sizeof pname, "messages.%zu", i);
        if (!json_is_object(m)) return INVALID(err, pname, "%s: must be an object", pname);
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            if (strcmp(k, "role") != 0 && strcmp(k, "content") != 0)
                return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                                  "%s.%.40s: Extra inputs are not permitted", pname, k);
        }
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *r = json_string_value(role);
        if (!r || (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0)) {
            snprintf(pname, sizeof pname, "messages.%zu.role", i);
            return INVALID(err, pname, "%s: Input should be 'user' or 'assistant'%s", pname,
                           r && !strcmp(r, "system")
                               ? " (the system prompt goes in the top-level 'system' field)"
                               : "");
        }
        bool user = r[0] == 'u';
        if (!user && i == n - 1)
            return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                              "%s: a final assistant message (a prefill for the answer to "
                              "continue) is not supported; end with a user message",
                              pname);
        if (json_is_string(content)) {
            if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", r, "content", content)))
                return srv_fail(err, 500, "internal_error", "out of memory");
            continue;
        }
        if (!json_is_array(content) || json_array_size(content) == 0) {
            snprintf(pname, sizeof pname, "messages.%zu.content", i);
            return INVALID(err, pname,
                           "%s: must be a string or a non-empty array of content blocks, got %s",
                           pname,
                           json_is_array(content) ? "an empty array"
                           : content              ? srv_json_kind(content)
                                                  : "nothing");
        }
        snprintf(pname, sizeof pname, "messages.%zu.content", i);
        if (!anth__count_parts(&n_parts, json_array_size(content), pname, err)) return false;
        if (!(user ? anth__user(msgs, content, i, &n_parts, err)
                   : anth__assistant(msgs, content, i, err)))
            return false;
    }
    return true;
}

/* tools: [{name, description?, input_schema}] -> OpenAI functions. */
static bool anth__tools(json_t *out, json_t *tools, srv_error *err) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools))
        return INVALID(err, "tools", "tools: must be an array, got %s", srv_json_kind(tools));
    json_t *fns = json_array();
    json_object_set_new(out, "tools", fns);
    if (!fns) return srv_fail(err, 500, "internal_error", "out of memory");
    size_t i;
    json_t *t;
    char pname[64];
    json_array_foreach(tools, i, t) {
        snprintf(pname, sizeof pname, "tools.%zu", i);
        if (!json_is_object(t)) return INVALID(err, pname, "%s: must be an object", pname);
        json_t *type = json_object_get(t, "type");
        if (type && !json_is_null(type) &&
            (!json_is_string(type) || strcmp(json_string_value(type), "custom") != 0))
            return srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, pname,
                              "%s.type: '%.40s' tools (run by Anthropic's servers) are not "
                              "supported; define the tool with name, description and "
                              "input_schema",
                              pname, json_is_string(type) ? json_string_value(type) : "?");
        static const char *const keys[] = {"name", "description", "input_schema", NULL};
        if (!anth__block_keys(t, keys, pname, err)) return false;
        json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
        json_t *schema = json_object_get(t, "input_schema");
        if (!json_is_string(name)) return INVALID(err, pname, "%s.name: must be a string", pname);
        if (desc && !json_is_string(desc))
            return INVALID(err, pname, "%s.description: must be a string", pname);
        if (!json_is_object(schema))
            return INVALID(err, pname, "%s.input_schema: Field required (a JSON Schema object)",
                           pname);
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (fn && desc) json_object_set(fn, "description", desc);
        if (!fn ||
            json_array_append_new(fns, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
            return srv_fail(err, 500, "internal_error", "out of memory");
    }
    return true;
}

/* tool_choice {type: auto|any|tool|none, name?, disable_parallel_tool_use?}. */
static bool anth__tool_choice(json_t *out, json_t *tc, srv_error *err) {
    if (!tc || json_is_null(tc)) return true;
    json_t *type = json_object_get(tc, "type");
    if (!json_is_object(tc) || !json_is_string(type))
        return INVALID(err, "tool_choice", "tool_choice: must be an object with a string 'type'");
    static const char *const keys[] = {"name", "disable_parallel_tool_use", NULL};
    if (!anth__block_keys(tc, keys, "tool_choice", err)) return false;
    const char *t = json_string_value(type);
    json_t *name = json_object_get(tc, "name"),
           *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp))
        return INVALID(err, "tool_choice",
                       "tool_choice.disable_parallel_tool_use: must be a boolean");
    if (name && strcmp(t, "tool") != 0)
        return INVALID(err, "tool_choice", "tool_choice.name: only with type 'tool'");
    json_t *v;
    if (!strcmp(t, "auto"))
        v = json_string("auto");
    else if (!strcmp(t, "any"))
        v = json_string("required");
    else if (!strcmp(t, "none"))
        v = json_string("none");
    else if (!strcmp(t, "tool")) {
        if (!json_is_string(name))
            return INVALID(err, "tool_choice", "tool_choice.name: Field required for type 'tool'");
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else
        return INVALID(err, "tool_choice",
                       "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none', got "
                       "'%.32s'",
                       t);
    if (!v) return srv_fail(err, 500, "internal_error", "out of memory");
    json_object_set_new(out, "tool_choice", v);
    if (json_is_true(dp)) json_object_set_new(out, "parallel_tool_calls", json_false());
    return true;
}

/* thinking {type: enabled (budget_tokens >= 1024, < max_tokens) | disabled}. */
static bool anth__thinking(json_t *out, json_t *th, long long max_tokens, srv_error *err) {
    if (!th || json_is_null(th)) return true;
    json_t *type = json_object_get(th, "type");
    if (!json_is_object(th) || !json_is_string(type))
        return INVALID(err, "thinking", "thinking: must be an object with a string 'type'");
    static const char *const keys[] = {"budget_tokens", NULL};
    if (!anth__block_keys(th, keys, "thinking", err)) return false;
    const char *t = json_string_value(type);
    bool on = !strcmp(t, "enabled");
    if (!on && strcmp(t, "disabled") != 0)
        return INVALID(err, "thinking",
                       "thinking.type: Input should be 'enabled' or 'disabled', got '%.32s'", t);
    json_t *bt = json_object_get(th, "budget_tokens");
    if (on) {
        if (!json_is_integer(bt))
            return INVALID(err, "thinking", "thinking.budget_tokens: Field required (an integer)");
        long long b = json_integer_value(bt);
        if (b < 1024 || b >= max_tokens)
            return INVALID(err, "thinking",
                           "thinking.budget_tokens: must be >= 1024 and less than max_tokens "
                           "(%lld), got %lld",
                           max_tokens, b);
    } else if (bt) {
        return INVALID(err, "thinking", "thinking.budget_tokens: only with type 'enabled'");
    }
    // the template decides: Qwen3-style templates read enable_thinking
    json_t *kw = json_pack("{s:b}", "enable_thinking", on);
    if (!kw) return srv_fail(err, 500, "internal_error", "out of memory");
    json_object_set_new(out, "chat_template_kwargs", kw);
    return true;
}

json_t *srv_anth_to_chat(json_t *root, srv_error *err) {
    if (!json_is_object(root)) {
        INVALID(err, NULL, "the request body must be a JSON object, got %s", srv_json_kind(root));
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (anth__in(anth__fields, k) || srv_sampling_known(k, true)) continue;
        char param[64];
        snprintf(param, sizeof param, "%.63s", k);
        srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, param,
                   "%.64s: Extra inputs are not permitted (not supported by this server)", k);
        return NULL;
    }
    json_t *out = json_object();
    if (!out) {
        srv_fail(err, 500, "internal_error", "out of memory");
        return NULL;
    }
    json_t *mdl = json_object_get(root, "model"), *mt = json_object_get(root, "max_tokens");
    if (!mdl) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "model", "model: Field required");
        goto fail;
    }
    if (!json_is_string(mdl)) {
        INVALID(err, "model", "model: must be a string, got %s", srv_json_kind(mdl));
        goto fail;
    }
    json_object_set(out, "model", mdl);
    if (!mt) {
        srv_refuse(err, ADMIT_MISSING_PARAMETER, "max_tokens", "max_tokens: Field required");
        goto fail;
    }
    if (!json_is_integer(mt) || json_integer_value(mt) < 1) {
        INVALID(err, "max_tokens", "max_tokens: must be an integer >= 1");
        goto fail;
    }
    json_object_set(out, "max_tokens", mt);
    if (!anth__messages(out, root, err)) goto fail;
    // sampling: Anthropic's ranges (temperature 0..1); api.c checks types again
    double temp = 0;
    if ((v = json_object_get(root, "temperature")) && !json_is_null(v)) {
        temp = json_number_value(v);
        if (!json_is_number(v) || temp < 0 || temp > 1) {
            INVALID(err, "temperature", "temperature: must be a number in [0, 1]");
            goto fail;
        }
        json_object_set(out, "temperature", v);
    }
    if ((v = json_object_get(root, "stream")) && !json_is_null(v)) json_object_set(out, "stream", v);
    // the sampler's Anthropic keys (SAMPLE_PARAM_MAP's anth column) pass as they are
    json_object_foreach(root, k, v) {
        if (!json_is_null(v) && strcmp(k, "temperature") && srv_sampling_known(k, true))
            json_object_set(out, k, v);
    }
    if ((v = json_object_get(root, "stop_sequences")) && !json_is_null(v)) {
        size_t i;
        json_t *s;
        if (!json_is_array(v)) {
            INVALID(err, "stop_sequences", "stop_sequences: must be an array of strings");
            goto fail;
        }
        json_array_foreach(v, i, s) {
            if (!json_is_string(s) || !json_string_length(s)) {
                INVALID(err, "stop_sequences", "stop_sequences.%zu: must be a non-empty string", i);
                goto fail;
            }
        }
        if (json_array_size(v) > SRV_MAX_STOPS) {
            INVALID(err, "stop_sequences", "stop_sequences: at most %d are supported, got %zu",
                    SRV_MAX_STOPS, json_array_size(v));
            goto fail;
        }
        if (json_array_size(v)) json_object_set(out, "stop", v);
    }
    if ((v = json_object_get(root, "metadata")) && !json_is_null(v) && !json_is_object(v)) {
        INVALID(err, "metadata", "metadata: must be an object");
        goto fail;
    }
    if (!anth__tools(out, json_object_get(root, "tools"), err)) goto fail;
    if (!anth__tool_choice(out, json_object_get(root, "tool_choice"), err)) goto fail;
    if (!anth__thinking(out, json_object_get(root, "thinking"), json_integer_value(mt), err))
        goto fail;
    return out;
fail:
    json_decref(out);
    return NULL;
}

bool srv_anth_parse(const char *body, size_t len, srv_request *r, srv_error *err) {
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return srv_refuse(err, ADMIT_INVALID_JSON, NULL,
                          "malformed JSON at line %d, column %d (position %d): %s", je.line,
                          je.column, je.position, je.text);
    json_t *chat = srv_anth_to_chat(root, err);
    json_decref(root);
    if (!chat) return false;
    char *text = json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    if (!text) return srv_fail(err, 500, "internal_error", "out of memory");
    bool ok = srv_request_parse(SRV_ROUTE_CHAT, text, strlen(text), r, err);
    free(text);
    if (ok) r->route = SRV_ROUTE_MESSAGES;
    return ok;
}

bool srv_anth_count_parse(const char *body, size_t len, srv_request *r, srv_error *err) {
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return srv_refuse(err, ADMIT_INVALID_JSON, NULL,
                          "malformed JSON at line %d, column %d (position %d): %s", je.line,
                          je.column, je.position, je.text);
    // no answer is generated: max_tokens is not asked for; the largest
    // stands in, so any thinking budget passes as it would with its own
    if (json_is_object(root) && !json_object_get(root, "max_tokens"))
        json_object_set_new(root, "max_tokens", json_integer(SRV_MAX_TOKENS_LIMIT));
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return srv_fail(err, 500, "internal_error", "out of memory");
    bool ok = srv_anth_parse(text, strlen(text), r, err);
    free(text);
    return ok;
}

// ----------------------------------------------------------------------------
// Answers

void srv_anth_tool_id(const char *call_id, char *buf, size_t cap) {
    if (!strncmp(call_id, "call_", 5)) call_id += 5;
    snprintf(buf, cap, "toolu_%s", call_id);
}

const char *srv_anth_stop_match(const char *raw, size_t n, const char *const *stops, int n_stops) {
    const char *best = NULL;
    size_t best_end = 0;
    for (int i = 0; raw && i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t at = 0; sl && at + sl <= n; at++) {
            if (memcmp(raw + at, stops[i], sl) != 0) continue;
            if (!best || at + sl < best_end) best = stops[i], best_end = at + sl;
            break;
        }
    }
    return best;
}

const char *srv_anth_stop_reason(engine_finish f, bool calls, const char *stop_seq) {
    if (f == ENGINE_FINISH_LENGTH) return "max_tokens";
    if (f != ENGINE_FINISH_STOP) return NULL;
    if (calls) return "tool_use";
    return stop_seq ? "stop_sequence" : "end_turn";
}

json_t *srv_anth_text_block(bool thinking, json_t *text) {
    if (!text) return NULL;
    if (thinking)
        return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", text, "signature", "");
    return json_pack("{s:s, s:o}", "type", "text", "text", text);
}

json_t *srv_anth_tool_block(const char *id, const char *name, const char *args) {
    json_error_t je;
    json_t *input = json_loads(args ? args : "{}", 0, &je);
    if (!json_is_object(input)) {
        json_decref(input);
        input = json_object();
    }
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", name, "input",
                     input);
}

json_t *srv_anth_message(const char *id, const char *model_name, json_t *content,
                         const char *stop_reason, const char *stop_seq, int32_t n_prompt,
                         int32_t n_cached, int32_t n_gen) {
    if (!content) return NULL;
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:{s:i, s:i, s:i, s:i}}", "id", id,
                     "type", "message", "role", "assistant", "model", model_name, "content",
                     content, "stop_reason", stop_reason, "stop_sequence", stop_seq, "usage",
                     "input_tokens", (int)(n_prompt - n_cached), "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", (int)n_cached, "output_tokens", (int)n_gen);
}

// ----------------------------------------------------------------------------
// Streaming

/* Appends "event: NAME\ndata: JSON\n\n" of j (consumed). */
static bool anth__event(srv_buf *b, const char *name, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    bool ok = s && srv_buf_add(b, "event: ", 7) && srv_buf_add(b, name, strlen(name)) &&
              srv_buf_add(b, "\ndata: ", 7) && srv_buf_add(b, s, strlen(s)) &&
              srv_buf_add(b, "\n\n", 2);
    free(s);
    return ok;
}

static bool anth__close(srv_anth_sse *st, srv_buf *b) {
    if (!st->open) return true;
    st->open = 0;
    return anth__event(b, "content_block_stop",
                       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->index++));
}

bool srv_anth_sse_start(srv_anth_sse *st, srv_buf *b, const char *id, const char *model_name,
                        int32_t n_prompt, int32_t n_cached) {
    st->n_prompt = n_prompt;
    st->n_cached = n_cached;
    json_t *m = srv_anth_message(id, model_name, json_array(), NULL, NULL, n_prompt, n_cached, 0);
    return m &&
           anth__event(b, "message_start",
                       json_pack("{s:s, s:o}", "type", "message_start", "message", m)) &&
           anth__event(b, "ping", json_pack("{s:s}", "type", "ping"));
}

bool srv_anth_sse_text(srv_anth_sse *st, srv_buf *b, bool thinking, json_t *text) {
    if (!text) return false;
    if (!json_string_length(text)) {
        json_decref(text);
        return true;
    }
    int want = thinking ? 2 : 1;
    bool ok = true;
    if (st->open != want) {
        ok = anth__close(st, b) &&
             anth__event(b, "content_block_start",
                         json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                   st->index, "content_block",
                                   srv_anth_text_block(thinking, json_string(""))));
        st->open = want;
    }
    return ok && anth__event(b, "content_block_delta",
                             json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta",
                                       "index", st->index, "delta", "type",
                                       thinking ? "thinking_delta" : "text_delta",
                                       thinking ? "thinking" : "text", text));
}

bool srv_anth_sse_tool(srv_anth_sse *st, srv_buf *b, const char *id, const char *name,
                       const char *args) {
    if (!anth__close(st, b)) return false;
    int idx = st->index++;
    json_t *blk = srv_anth_tool_block(id, name, "{}");
    return blk &&
           anth__event(b, "content_block_start",
                       json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", idx,
                                 "content_block", blk)) &&
           anth__event(b, "content_block_delta",
                       json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                 idx, "delta", "type", "input_json_delta", "partial_json",
                                 args ? args : "{}")) &&
           anth__event(b, "content_block_stop",
                       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", idx));
}

bool srv_anth_sse_end(srv_anth_sse *st, srv_buf *b, const char *stop_reason, const char *stop_seq,
                      int32_t n_gen) {
    // usage in message_delta is cumulative, and a client merges it into the
    // message: its input numbers are message_start's, so the two agree (the
    // cached part is known only at the end, after message_start went out;
    // a stream reports the whole prompt as input, the non-streamed answer
    // splits it).
    // An answer with no block at all still has its (empty) text block, as
    // the non-streamed message does.
    bool ok = true;
    if (!st->open && st->index == 0) {
        ok = anth__event(b, "content_block_start",
                         json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", 0,
                                   "content_block", srv_anth_text_block(false, json_string(""))));
        st->open = 1;
    }
    return ok && anth__close(st, b) &&
           anth__event(b, "message_delta",
                       json_pack("{s:s, s:{s:s?, s:s?}, s:{s:i, s:i, s:i, s:i}}", "type",
                                 "message_delta", "delta", "stop_reason", stop_reason,
                                 "stop_sequence", stop_seq, "usage", "input_tokens",
                                 (int)(st->n_prompt - st->n_cached), "cache_creation_input_tokens",
                                 0, "cache_read_input_tokens", (int)st->n_cached, "output_tokens",
                                 (int)n_gen)) &&
           anth__event(b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

bool srv_anth_sse_error(srv_buf *b, const srv_error *e) {
    return anth__event(b, "error",
                       json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                                 srv_anth_error_type(e->status), "message", e->msg));
}
