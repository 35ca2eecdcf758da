/* chat_req.c — what a chat request hands its chat template: the messages
 * (with tool calls and tool results), the tools and chat_template_kwargs,
 * validated with OpenAI's error shape and turned into the JSON the template
 * renders (server_int.h: srv_chat_prepare, srv_chat_render).
 *
 * Messages reach the template as vLLM passes them: role, content (a string;
 * "" for the null content of an assistant message that only calls tools;
 * text parts joined by "\n"), name, tool_call_id, reasoning_content, and
 * tool_calls whose function.arguments, a JSON string on the wire, is parsed
 * into an object (templates iterate it or pass it to tojson). */
#include "server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

static const char *const chat__roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
static const char *const chat__msg_keys[] = {"name", "tool_calls", "tool_call_id",
                                             "reasoning_content", NULL};

static bool chat__in(const char *const *set, const char *s) {
    for (; *set; set++)
        if (!strcmp(*set, s)) return true;
    return false;
}

bool srv_chat_message_key_ok(const char *key) { return chat__in(chat__msg_keys, key); }

/* One tool call of message i: {id?, type: "function", function: {name,
 * arguments}} into a new object with arguments parsed. */
static json_t *chat__tool_call(json_t *tc, size_t i, size_t j, srv_error *err) {
    char pname[96];
    snprintf(pname, sizeof pname, "messages[%zu].tool_calls[%zu]", i, j);
    if (!json_is_object(tc)) {
        INVALID(err, pname, "'%s' must be an object, got %s", pname, srv_json_kind(tc));
        return NULL;
    }
    json_t *id = json_object_get(tc, "id"), *type = json_object_get(tc, "type");
    json_t *fn = json_object_get(tc, "function");
    if (id && !json_is_string(id)) {
        INVALID(err, pname, "'%s.id' must be a string", pname);
        return NULL;
    }
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)) {
        INVALID(err, pname, "'%s.type' must be \"function\"", pname);
        return NULL;
    }
    json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
    if (!json_is_object(fn) || !json_is_string(name)) {
        INVALID(err, pname, "'%s.function' must be an object with a string 'name'", pname);
        return NULL;
    }
    json_t *parsed;
    if (json_is_string(args)) {
        json_error_t je;
        parsed =
            json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je);
        if (!parsed) {
            snprintf(pname + strlen(pname), sizeof pname - strlen(pname), ".function.arguments");
            INVALID(err, pname, "'%s' must be a JSON string: %s", pname, je.text);
            return NULL;
        }
    } else if (json_is_object(args)) {
        parsed = json_incref(args);
    } else if (!args || json_is_null(args)) {
        parsed = json_object();
    } else {
        snprintf(pname + strlen(pname), sizeof pname - strlen(pname), ".function.arguments");
        INVALID(err, pname, "'%s' must be a string holding JSON, got %s", pname,
                srv_json_kind(args));
        return NULL;
    }
    json_t *out = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", name,
                            "arguments", parsed);
    if (out && id) json_object_set(out, "id", id);
    if (!out) srv_fail(err, 500, "internal_error", "out of memory");
    return out;
}

/* Message i as the template sees it, or NULL with *err filled. */
static json_t *chat__message(srv_request *r, json_t *m, size_t i, srv_error *err) {
    char pname[96];
    const char *role = r->msgs[i].role;
    if (!chat__in(chat__roles, role)) {
        snprintf(pname, sizeof pname, "messages[%zu].role", i);
        INVALID(err, pname, "'%s' must be system, developer, user, assistant or tool, got '%.64s'",
                pname, role);
        return NULL;
    }
    json_t *out = json_pack("{s:s}", "role", role);
    if (!out) {
        srv_fail(err, 500, "internal_error", "out of memory");
        return NULL;
    }
    json_t *content = json_object_get(m, "content");
    bool null_content = json_is_null(content);
    json_t *text;
    if (json_is_array(content)) { /* text parts, joined by "\n" as vLLM joins them */
        // one growing buffer: linear in the parts' total size (api.c checked
        // every part is a text part and bounded their number)
        size_t k;
        json_t *part;
        srv_buf b = {0};
        bool ok = true;
        json_array_foreach(content, k, part) {
            json_t *t = json_object_get(part, "text");
            ok = ok && (!k || srv_buf_add(&b, "\n", 1)) &&
                 srv_buf_add(&b, json_string_value(t), json_string_length(t));
        }
        text = ok ? json_stringn_nocheck(b.p ? b.p : "", b.len) : NULL;
        srv_buf_free(&b);
        if (!text) {
            json_decref(out);
            srv_fail(err, 500, "internal_error", "out of memory");
            return NULL;
        }
    } else {
        /* null (a tool-calling assistant turn) reaches the template as "", as
         * vLLM passes it: templates test `'</think>' in content` and the like */
        text = json_string(null_content ? "" : r->msgs[i].content);
    }
    json_object_set_new(out, "content", text);
    json_t *tcs = json_object_get(m, "tool_calls");
    if (tcs && !json_is_null(tcs)) {
        snprintf(pname, sizeof pname, "messages[%zu].tool_calls", i);
        if (strcmp(role, "assistant") != 0) {
            INVALID(err, pname, "'%s' is only allowed on assistant messages", pname);
            goto fail;
        }
        if (!json_is_array(tcs) || json_array_size(tcs) == 0) {
            INVALID(err, pname, "'%s' must be a non-empty array", pname);
            goto fail;
        }
        json_t *arr = json_array();
        json_object_set_new(out, "tool_calls", arr);
        size_t j;
        json_t *tc;
        json_array_foreach(tcs, j, tc) {
            json_t *c = chat__tool_call(tc, i, j, err);
            if (!c) goto fail;
            json_array_append_new(arr, c);
        }
    } else if (null_content) {
        snprintf(pname, sizeof pname, "messages[%zu].content", i);
        INVALID(err, pname, "'%s' may be null only on an assistant message with tool_calls", pname);
        goto fail;
    }
    static const char *const strs[] = {"name", "tool_call_id", "reasoning_content", NULL};
    for (const char *const *k = strs; *k; k++) {
        json_t *v = json_object_get(m, *k);
        if (!v || json_is_null(v)) continue;
        snprintf(pname, sizeof pname, "messages[%zu].%s", i, *k);
        if (!json_is_string(v)) {
            INVALID(err, pname, "'%s' must be a string, got %s", pname, srv_json_kind(v));
            goto fail;
        }
        json_object_set(out, *k, v);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* The chat_template_kwargs a request may set, with their JSON types: the
 * switches templates document (Qwen3/GLM enable_thinking, DeepSeek V3.1
 * thinking, gpt-oss reasoning_effort, Llama 3.x tools_in_user_message,
 * date_string and builtin_tools, Command-R/Granite documents). Anything
 * else is refused: a key would otherwise shadow the template's globals
 * (bos_token, eos_token, raise_exception, range, namespace, ...) or the
 * request's own fields (messages, tools, add_generation_prompt). docs/api.md
 * "Chat templates" lists them. */
static const struct {
    const char *key;
    json_type type;
} chat__kwargs[] = {
    {"enable_thinking", JSON_TRUE},   {"thinking", JSON_TRUE},
    {"reasoning_effort", JSON_STRING}, {"tools_in_user_message", JSON_TRUE},
    {"date_string", JSON_STRING},     {"builtin_tools", JSON_ARRAY},
    {"documents", JSON_ARRAY},
};

/* Checks one chat_template_kwargs entry; false with a 400 naming it. */
static bool chat__kwarg_ok(const char *k, json_t *v, srv_error *err) {
    for (size_t i = 0; i < sizeof chat__kwargs / sizeof *chat__kwargs; i++) {
        if (strcmp(k, chat__kwargs[i].key) != 0) continue;
        json_type t = chat__kwargs[i].type;
        bool ok = t == JSON_TRUE ? json_is_boolean(v) : json_typeof(v) == t;
        if (ok) return true;
        return INVALID(err, "chat_template_kwargs", "'chat_template_kwargs': '%s' must be %s, got %s",
                       k, t == JSON_TRUE ? "a boolean" : t == JSON_STRING ? "a string" : "an array",
                       srv_json_kind(v));
    }
    return INVALID(err, "chat_template_kwargs",
                   "'chat_template_kwargs' cannot set '%.64s': only enable_thinking, thinking, "
                   "reasoning_effort, tools_in_user_message, date_string, builtin_tools and "
                   "documents may be set (the template's globals and the request's own fields "
                   "cannot be overridden)",
                   k);
}

bool srv_chat_prepare(srv_request *r, json_t *root, srv_error *err) {
    json_t *msgs = json_object_get(root, "messages");
    json_t *tools = json_object_get(root, "tools");
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (json_array_size(tools)) r->tools = tools; // toolcall_req_parse validated them
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return INVALID(err, "chat_template_kwargs",
                           "'chat_template_kwargs' must be an object, got %s", srv_json_kind(kw));
        static const char *const reserved[] = {"messages", "tools", "add_generation_prompt", NULL};
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (chat__in(reserved, k))
                return INVALID(err, "chat_template_kwargs",
                               "'chat_template_kwargs' cannot set '%s' (the request does)", k);
            if (!chat__kwarg_ok(k, v, err)) return false;
        }
        r->tmpl_kwargs = kw;
    }
    r->tmpl_msgs = json_array();
    if (!r->tmpl_msgs) return srv_fail(err, 500, "internal_error", "out of memory");
    for (size_t i = 0; i < r->n_msgs; i++) {
        json_t *m = chat__message(r, json_array_get(msgs, i), i, err);
        if (!m) return false;
        json_array_append_new(r->tmpl_msgs, m);
    }
    return true;
}

ks_err srv_chat_render(const chat_tmpl *t, const tok_vocab *v, const srv_request *r, char **out,
                       bool *add_special, tok_span **spans, size_t *n_spans, srv_error *err,
                       ks_errbuf *eb) {
    *out = NULL;
    *add_special = true;
    *spans = NULL;
    *n_spans = 0;
    if (!chat_tmpl_is_plain(t)) {
        *add_special = false; // the template writes BOS and the like itself (as HF / vLLM)
        return chat_tmpl_apply_marked(t, r->tmpl_msgs, r->tools, r->tmpl_kwargs, true, 0, out,
                                      spans, n_spans, eb);
    }
    if (r->tools) {
        srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, "tools",
                   "'tools' needs a chat template, and this model has none (start the server "
                   "with --chat-template-file)");
        return KS_ERR_AGAIN;
    }
    for (size_t i = 0; i < r->n_msgs; i++) {
        if (strcmp(r->msgs[i].role, "tool") != 0 && strcmp(r->msgs[i].role, "developer") != 0)
            continue;
        char pname[64];
        snprintf(pname, sizeof pname, "messages[%zu].role", i);
        srv_refuse(err, ADMIT_INVALID, pname,
                   "role '%s' needs a chat template, and this model has none", r->msgs[i].role);
        return KS_ERR_AGAIN;
    }
    return chat_render_family_marked(CHAT_PLAIN, v, r->msgs, r->n_msgs, true, out, spans, n_spans,
                                     eb);
}
