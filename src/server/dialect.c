/* dialect.c — what differs between the APIs the server speaks (OpenAI,
 * Workers AI, Anthropic), as one table: the error envelope, where the API
 * key may come from and what a missing one is told, and how a stream ends;
 * and each route's dialect and metrics label. A floor below the parsers and
 * the HTTP front: it calls only errors.c. */
#include "server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Error envelopes

static char *dia__dump(json_t *j) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* OpenAI's {"error":{message,type,param,code}}. */
static char *dia__openai_error(const srv_error *e) {
    return dia__dump(json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type",
                               e->type ? e->type : "invalid_request_error", "param",
                               e->param[0] ? json_string(e->param) : json_null(), "code",
                               e->code ? json_string(e->code) : json_null()));
}

/* Workers AI's envelope; it numbers its errors: the table's code (admit.h),
 * else the HTTP status. */
static char *dia__workers_error(const srv_error *e) {
    return dia__dump(json_pack("{s:n, s:b, s:[{s:i, s:s}], s:[]}", "result", "success", 0,
                               "errors", "code", (int)e->workers_code, "message", e->msg,
                               "messages"));
}

const char *srv_anth_error_type(int status) {
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_anth_error_json(const srv_error *e) {
    return dia__dump(json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                               srv_anth_error_type(e->status), "message", e->msg));
}

// ----------------------------------------------------------------------------
// The table

static const srv_dialect_info dia__table[SRV_DIALECT__COUNT] = {
    [SRV_DIALECT_OPENAI] = {
        .name = "openai",
        .error_json = dia__openai_error,
        .key_header = NULL,
        .missing_key = "missing API key: send the header 'Authorization: Bearer <key>'",
        .stream_usage = true,
    },
    [SRV_DIALECT_WORKERS] = {
        .name = "workers_ai",
        .error_json = dia__workers_error,
        .key_header = NULL,
        .missing_key = "missing API key: send the header 'Authorization: Bearer <key>'",
        .stream_usage = false,
    },
    [SRV_DIALECT_ANTHROPIC] = {
        .name = "anthropic",
        .error_json = srv_anth_error_json,
        .key_header = "x-api-key",
        .missing_key = "missing API key: send the header 'x-api-key: <key>'",
        .stream_usage = false,
    },
};

/* Each route's metrics label and dialect (its error envelope). */
static const struct {
    const char *name;
    srv_dialect dialect;
} dia__routes[SRV_ROUTE__COUNT] = {
    [SRV_ROUTE_CHAT] = {"chat_completions", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_COMPLETIONS] = {"completions", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_WORKERS] = {"workers_ai", SRV_DIALECT_WORKERS},
    [SRV_ROUTE_MODELS] = {"models", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_HEALTH] = {"health", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_METRICS] = {"metrics", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_ADMIN] = {"admin", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_OTHER] = {"other", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_EMBEDDINGS] = {"embeddings", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_TOKENIZE] = {"tokenize", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_MESSAGES] = {"messages", SRV_DIALECT_ANTHROPIC},
    [SRV_ROUTE_WORKERS_CHAT] = {"workers_ai_chat", SRV_DIALECT_WORKERS},
    [SRV_ROUTE_COUNT_TOKENS] = {"messages_count_tokens", SRV_DIALECT_ANTHROPIC},
    [SRV_ROUTE_UI] = {"ui", SRV_DIALECT_OPENAI},
    [SRV_ROUTE_RESPONSES] = {"responses", SRV_DIALECT_OPENAI},
};

const srv_dialect_info *srv_dialect_get(srv_dialect d) {
    return &dia__table[(unsigned)d < SRV_DIALECT__COUNT ? d : SRV_DIALECT_OPENAI];
}

srv_dialect srv_route_dialect(srv_route r) {
    return (unsigned)r < SRV_ROUTE__COUNT ? dia__routes[r].dialect : SRV_DIALECT_OPENAI;
}

const char *srv_route_name(srv_route r) {
    return (unsigned)r < SRV_ROUTE__COUNT ? dia__routes[r].name : "other";
}

/* What each generation route answers with. */
static const srv_answer_info dia__answers[SRV_ROUTE__COUNT] = {
    [SRV_ROUTE_CHAT] = {SRV_ROUTE_CHAT, true, "chatcmpl-", -1, "chat.completion",
                        "chat.completion.chunk"},
    [SRV_ROUTE_COMPLETIONS] = {SRV_ROUTE_COMPLETIONS, false, "cmpl-", 16 /* OpenAI's */,
                               "text_completion", "text_completion"},
    [SRV_ROUTE_WORKERS] = {SRV_ROUTE_WORKERS, false, "chatcmpl-", 256 /* Workers AI's */, NULL,
                           NULL},
    [SRV_ROUTE_MESSAGES] = {SRV_ROUTE_MESSAGES, true, "msg_", -1, "message", NULL},
    [SRV_ROUTE_WORKERS_CHAT] = {SRV_ROUTE_CHAT, true, "chatcmpl-", -1, "chat.completion",
                                "chat.completion.chunk"},
    [SRV_ROUTE_RESPONSES] = {SRV_ROUTE_RESPONSES, true, "resp_", -1, "response", NULL},
};

const srv_answer_info *srv_route_answer(srv_route r) {
    if ((unsigned)r >= SRV_ROUTE__COUNT || !dia__answers[r].id_prefix) r = SRV_ROUTE_CHAT;
    return &dia__answers[r];
}

char *srv_error_json(srv_route route, const srv_error *e) {
    return srv_dialect_get(srv_route_dialect(route))->error_json(e);
}
