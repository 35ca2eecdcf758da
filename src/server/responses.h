/* responses.h — OpenAI's Responses API (POST /v1/responses, GET and DELETE
 * /v1/responses/{id}) on kvseal's chat machinery (server module,
 * src/server/responses.c): the request translated into the OpenAI chat
 * request it means (then validated by api.c and chat_req.c like any other),
 * the answer's output items and typed SSE events, and the per-tenant store
 * of finished responses that previous_response_id continues. Everything
 * here is pure except the store, which is thread-safe. docs/responses.md
 * says what is supported. */
#ifndef KS_RESPONSES_H
#define KS_RESPONSES_H

#include "kvseal/engine.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_error srv_error;
typedef struct srv_request srv_request;
typedef struct srv_buf srv_buf;

// ----------------------------------------------------------------------------
// The store (per tenant, bounded in count, bytes and age; wiped on removal)

typedef struct srv_resp_store srv_resp_store;

/* A store keeping at most max_count responses and max_bytes bytes (their
 * JSON) per tenant, the oldest evicted first, each for at most ttl_s
 * seconds. NULL on out-of-memory. Caller owns (srv_resp_store_destroy). */
srv_resp_store *srv_resp_store_create(size_t max_count, size_t max_bytes, uint64_t ttl_s);
/* Wipes and frees every entry, then the store; accepts NULL. */
void srv_resp_store_destroy(srv_resp_store *st);
/* Keeps tenant's response resp (its object) and conv (the conversation's
 * items: inputs then outputs, what previous_response_id continues) under
 * id at now_ns (both borrowed, serialized). Evicts the tenant's expired and
 * oldest entries to stay in bounds; one larger than max_bytes alone is not
 * kept (KS_ERR_NOSPACE). KS_ERR_NOMEM. Thread-safe. */
ks_err srv_resp_store_put(srv_resp_store *st, const char *tenant, const char *id,
                          const json_t *resp, const json_t *conv, uint64_t now_ns) KS_MUST_USE;
/* Tenant's response id at now_ns: its object (conv false) or its
 * conversation items (conv true), a new reference; NULL when there is none
 * for this tenant (unknown, another tenant's, expired: the same answer) or
 * on out-of-memory. Thread-safe. */
json_t *srv_resp_store_get(srv_resp_store *st, const char *tenant, const char *id, bool conv,
                           uint64_t now_ns);
/* Removes (wipes) tenant's response id; false when it has none such.
 * Thread-safe. */
bool srv_resp_store_delete(srv_resp_store *st, const char *tenant, const char *id, uint64_t now_ns);
/* Entries and bytes tenant holds now (expired ones not counted). */
void srv_resp_store_usage(srv_resp_store *st, const char *tenant, uint64_t now_ns,
                          size_t *n /* OUT */, size_t *bytes /* OUT */);

// ----------------------------------------------------------------------------
// Requests

/* What a Responses request carries besides the chat request it becomes. */
typedef struct srv_resp_req {
    json_t *echo;  /* the request parameters a response object echoes (owned) */
    json_t *items; /* the conversation's items so far: the previous response's, then this
                      request's input (owned; stored with the output) */
    bool store;    /* keep the response (store, default true) */
} srv_resp_req;

/* Translates a Responses request body (root, borrowed) into the OpenAI chat
 * body it means, given prev (the previous response's conversation items,
 * borrowed; NULL: none): instructions as a first system message, then
 * prev's items and input's (a string; or messages user/system/developer/
 * assistant with string or input_text/output_text content, function_call
 * -> an assistant tool call, function_call_output -> a tool message,
 * reasoning -> the next assistant turn's reasoning_content),
 * max_output_tokens -> max_tokens, temperature, top_p, tools (function
 * tools), tool_choice, parallel_tool_calls, text.format -> response_format,
 * stream. Fills *x (echo, items, store). NULL with *err filled (400 naming
 * the field, "input[2].content[0].type"; 500 out of memory). Pure. */
json_t *srv_resp_to_chat(json_t *root, json_t *prev, srv_resp_req *x /* OUT */,
                         srv_error *err /* OUT */);
/* Parses and validates a Responses body for tenant: previous_response_id
 * is looked up in st (none, expired or another tenant's: 400
 * previous_response_not_found), then srv_resp_to_chat and
 * srv_request_parse as a chat request (errors renamed to the Responses
 * fields), r->route SRV_ROUTE_RESPONSES. On success *r (srv_request_free)
 * and *x (srv_resp_req_free). Thread-safe. */
bool srv_resp_parse(const char *body, size_t len, srv_resp_store *st, const char *tenant,
                    uint64_t now_ns, srv_request *r /* OUT */, srv_resp_req *x /* OUT */,
                    srv_error *err /* OUT */);
/* Frees what srv_resp_to_chat filled; accepts a zeroed x. */
void srv_resp_req_free(srv_resp_req *x);

// ----------------------------------------------------------------------------
// Answers: output items, built event by event (streamed or not)

/* An answer's output as it is generated. Zero-initialize; owned by the
 * answer. */
typedef struct srv_resp_out {
    srv_buf *b;     /* where events go; NULL: none (a non-streamed answer) */
    int64_t seq;    /* the next event's sequence_number */
    json_t *output; /* the output items so far (owned) */
    int open;       /* the open item: 0 none, 1 message, 2 reasoning */
    char *text;     /* its text so far (malloc'd) */
    size_t text_len, text_cap;
    char item_id[48]; /* its id */
    char *pend;       /* message text of whitespace only, not yet an item (malloc'd) */
    size_t pend_len;
    int32_t n_reasoning; /* tokens that were reasoning (usage.output_tokens_details) */
    bool oom;            /* an item could not be kept */
} srv_resp_out;

/* A response object: echo's fields (copied) with id, object "response",
 * created_at, status ("in_progress", "completed", "incomplete" with
 * incomplete_details {reason:"max_output_tokens"}, "failed"), model, output
 * (copied; NULL: []), usage (stolen; NULL: null), error null. NULL on
 * out-of-memory. */
json_t *srv_resp_object(const json_t *echo, const char *id, long long created,
                        const char *model_name, const char *status, const json_t *output,
                        json_t *usage);
/* usage {input_tokens, input_tokens_details {cached_tokens}, output_tokens,
 * output_tokens_details {reasoning_tokens}, total_tokens}; new reference. */
json_t *srv_resp_usage(int32_t n_prompt, int32_t n_cached, int32_t n_gen, int32_t n_reasoning);
/* Starts the answer: with events, response.created and response.in_progress
 * carrying resp (borrowed, the in-progress object). False on
 * out-of-memory. */
bool srv_resp_out_start(srv_resp_out *o, srv_buf *b, const json_t *resp) KS_MUST_USE;
/* Appends text (n bytes; reasoning or message text) to the open item of
 * that kind, opening it first (and closing another). False on
 * out-of-memory. */
bool srv_resp_out_text(srv_resp_out *o, bool reasoning, const char *s, size_t n) KS_MUST_USE;
/* Appends one function_call item whole (added, arguments delta and done,
 * done). False on out-of-memory. */
bool srv_resp_out_call(srv_resp_out *o, const char *call_id, const char *name,
                       const char *args) KS_MUST_USE;
/* Closes the open item (its done events); an answer without items gets an
 * empty message first. False on out-of-memory. */
bool srv_resp_out_close(srv_resp_out *o) KS_MUST_USE;
/* With events: response.completed / response.incomplete / response.failed
 * (after resp's status) carrying resp (borrowed). False on out-of-memory. */
bool srv_resp_out_end(srv_resp_out *o, const json_t *resp) KS_MUST_USE;
/* With events: an "error" event with e's fields. False on out-of-memory. */
bool srv_resp_out_error(srv_resp_out *o, const srv_error *e) KS_MUST_USE;
/* Frees what o holds; can't fail. */
void srv_resp_out_free(srv_resp_out *o);

#endif /* KS_RESPONSES_H */
