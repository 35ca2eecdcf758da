/* anthropic.h — Anthropic's Messages API (POST /v1/messages) on kvseal's
 * chat machinery (server module, src/server/anthropic.c): the request
 * translated into an OpenAI chat request (then validated by api.c and
 * chat_req.c like any other), and the answer's shapes: the message object,
 * its content blocks, the SSE events of a streamed answer, the error body.
 * Everything here is pure; the HTTP side (http.c) feeds it. */
#ifndef KS_ANTHROPIC_H
#define KS_ANTHROPIC_H

#include "kvseal/engine.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct srv_error srv_error;
typedef struct srv_request srv_request;
typedef struct srv_buf srv_buf;

// ----------------------------------------------------------------------------
// Requests

/* Translates a Messages request body (root, borrowed) into the OpenAI chat
 * body it means: system (a string or text blocks) as the first message;
 * user/assistant messages with string or block content (text; tool_use ->
 * the assistant's tool_calls, arguments as JSON text; tool_result -> tool
 * messages; thinking -> reasoning_content; redacted_thinking dropped);
 * max_tokens (required), stop_sequences -> stop, temperature, top_p,
 * top_k, stream; tools {name, description, input_schema} -> functions;
 * tool_choice auto/any/tool/none (disable_parallel_tool_use ->
 * parallel_tool_calls false); thinking enabled/disabled ->
 * chat_template_kwargs.enable_thinking. metadata and cache_control are
 * accepted without effect (kvseal caches prefixes by itself). Returns a new
 * object, or NULL with *err filled (400 naming the field as Anthropic's
 * API does, "messages.1.content.0.type"; 503 out of memory). Pure. */
json_t *srv_anth_to_chat(json_t *root, srv_error *err /* OUT */);

/* Parses a count_tokens body (POST /v1/messages/count_tokens: model,
 * messages, system, tools, tool_choice, thinking) as srv_anth_parse does a
 * Messages body, max_tokens not required. Pure; thread-safe. */
bool srv_anth_count_parse(const char *body, size_t len, srv_request *r /* OUT */,
                          srv_error *err /* OUT */);
/* Parses and validates a Messages request body: srv_anth_to_chat, then
 * srv_request_parse as a chat request, with r->route SRV_ROUTE_MESSAGES.
 * As srv_request_parse otherwise (free with srv_request_free). Pure;
 * thread-safe. */
bool srv_anth_parse(const char *body, size_t len, srv_request *r /* OUT */,
                    srv_error *err /* OUT */);

// ----------------------------------------------------------------------------
// Answers

/* A tool call's id as Anthropic spells one: "toolu_" + the parser's id
 * without its "call_" prefix. Can't fail (cut to cap). */
void srv_anth_tool_id(const char *call_id, char *buf, size_t cap);

/* Which of stops[0..n_stops) ended generation, given raw (the generated
 * tokens' text as the tokenizer wrote it, stop strings not removed): the
 * one whose first occurrence ends first (the engine stops there); NULL
 * when none occurs (an end-of-turn token ended it). Pure. */
const char *srv_anth_stop_match(const char *raw, size_t n, const char *const *stops, int n_stops);

/* stop_reason of an answer: "tool_use" when it holds calls and ended on a
 * stop, "max_tokens" (LENGTH), "stop_sequence" (stop_seq non-NULL),
 * "end_turn"; NULL when it did not finish (aborted, failed). Pure. */
const char *srv_anth_stop_reason(engine_finish f, bool calls, const char *stop_seq);

/* A content block: {"type":"text","text"} or {"type":"thinking",
 * "thinking","signature":""} of text (stolen, a JSON string); NULL on
 * out-of-memory. */
json_t *srv_anth_text_block(bool thinking, json_t *text);
/* {"type":"tool_use","id","name","input"} with input parsed from args (a
 * JSON object's text; anything else becomes {}); NULL on out-of-memory. */
json_t *srv_anth_tool_block(const char *id, const char *name, const char *args);

/* The message object {id, type:"message", role:"assistant", model, content
 * (stolen), stop_reason, stop_sequence, usage {input_tokens (the prompt
 * less cached tokens), cache_read_input_tokens, cache_creation_input_tokens,
 * output_tokens}}; NULL on out-of-memory. */
json_t *srv_anth_message(const char *id, const char *model_name, json_t *content,
                         const char *stop_reason, const char *stop_seq, int32_t n_prompt,
                         int32_t n_cached, int32_t n_gen);

/* (dialect.c, the Anthropic row's error envelope.)
 * The error body {"type":"error","error":{"type","message"}}, the type
 * from the status (400 invalid_request_error, 401 authentication_error,
 * 403 permission_error, 404 not_found_error, 413 request_too_large, 429
 * rate_limit_error, 503 overloaded_error, other 5xx api_error). A malloc'd
 * string (caller frees) or NULL on out-of-memory. */
char *srv_anth_error_json(const srv_error *e);
/* The "error.type" srv_anth_error_json writes for status; static storage. */
const char *srv_anth_error_type(int status);

// ----------------------------------------------------------------------------
// Streaming (SSE with event names)

/* A streamed answer's block state. Zero-initialize; owned by the answer. */
typedef struct srv_anth_sse {
    int index; /* the next content block's index */
    int open;  /* the open block: 0 none, 1 text, 2 thinking */
    int32_t n_prompt, n_cached; /* the input usage message_start reported */
} srv_anth_sse;

/* Appends "event: message_start" (the message with empty content, usage
 * with the input tokens: n_prompt - n_cached uncached, n_cached read from
 * the cache) and a ping, and keeps those numbers in st for message_delta.
 * False on out-of-memory. */
bool srv_anth_sse_start(srv_anth_sse *st, srv_buf *b, const char *id, const char *model_name,
                        int32_t n_prompt, int32_t n_cached) KS_MUST_USE;
/* Appends text (stolen JSON string; empty: nothing) as a text_delta or a
 * thinking_delta, opening that block first (and closing another that is
 * open). False on out-of-memory. */
bool srv_anth_sse_text(srv_anth_sse *st, srv_buf *b, bool thinking, json_t *text) KS_MUST_USE;
/* Appends one tool_use block whole: content_block_start (input {}), one
 * input_json_delta with args, content_block_stop. False on out-of-memory. */
bool srv_anth_sse_tool(srv_anth_sse *st, srv_buf *b, const char *id, const char *name,
                       const char *args) KS_MUST_USE;
/* Closes the open block (an answer that opened none gets an empty text
 * block first), then message_delta (stop_reason, stop_sequence,
 * the final usage as srv_anth_message's) and message_stop. False on
 * out-of-memory. */
bool srv_anth_sse_end(srv_anth_sse *st, srv_buf *b, const char *stop_reason, const char *stop_seq,
                      int32_t n_gen) KS_MUST_USE;
/* Appends "event: error" with e's error body. False on out-of-memory. */
bool srv_anth_sse_error(srv_buf *b, const srv_error *e) KS_MUST_USE;

#endif /* KS_ANTHROPIC_H */
