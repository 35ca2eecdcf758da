/* test_server_anthropic.c — Anthropic's Messages API (src/server/anthropic.c):
 * - the pure translation: a Messages body -> the OpenAI chat body it means
 *   (system, text/tool_use/tool_result/thinking blocks, tools, tool_choice,
 *   thinking, stop_sequences), and each refusal with its field named;
 * - the answer's pieces: which stop sequence ended an answer, stop_reason,
 *   the error body's type per status, the message object and the SSE event
 *   sequence (blocks opened, indexed and closed in order);
 * - through the HTTP front (http.c) on a scripted backend whose "model"
 *   writes a hermes tool call after a think block (kjv-mini never writes
 *   one by itself): POST /v1/messages answers thinking + tool_use blocks
 *   with stop_reason tool_use, streamed and not, the stream adding up to the
 *   same blocks; x-api-key authenticates; errors in Anthropic's shape.
 * Needs models/kjv-mini.gguf (tokenizer) via KS_SRC for the HTTP part. */
#include "../check.h"
#include "kvseal/server.h"
#include "server/server_int.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Translation

/* srv_anth_to_chat of body: the chat body as compact sorted JSON (caller
 * frees), or NULL with *err filled. */
static char *translate(const char *body, srv_error *err) {
    json_t *root = json_loads(body, 0, NULL);
    CHECK(root);
    memset(err, 0, sizeof *err);
    json_t *chat = srv_anth_to_chat(root, err);
    json_decref(root);
    if (!chat) return NULL;
    char *s = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(chat);
    return s;
}

static void expect_chat(const char *body, const char *want) {
    srv_error err;
    char *got = translate(body, &err);
    if (!got) fprintf(stderr, "refused: %s\n", err.msg);
    CHECK_STR_EQ(got, want);
    free(got);
}

/* body is refused with status and a message holding needle. */
static void expect_refused(const char *body, int status, const char *needle) {
    srv_error err;
    char *got = translate(body, &err);
    if (got) fprintf(stderr, "accepted: %s\n", got);
    CHECK(!got);
    CHECK_EQ(err.status, status);
    CHECK_STR_HAS(err.msg, needle);
    char *j = srv_anth_error_json(&err);
    CHECK(j);
    CHECK_STR_HAS(j, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\"");
    free(j);
}

#define M "\"model\":\"kjv\",\"max_tokens\":8,"

static void test_translate(void) {
    expect_chat("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                "{\"max_tokens\":8,\"messages\":[{\"content\":\"hi\",\"role\":\"user\"}],"
                "\"model\":\"kjv\"}");
    // system as text blocks (cache_control accepted), sampling, stops, stream
    expect_chat(
        "{" M "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\",\"cache_control\":"
        "{\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"Be kind.\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]}],\"temperature\":0.5,\"top_p\":0.5,"
        "\"top_k\":5,\"stop_sequences\":[\"END\"],\"stream\":true,\"metadata\":"
        "{\"user_id\":\"u\"}}",
        "{\"max_tokens\":8,\"messages\":[{\"content\":\"Be brief.\\nBe kind.\",\"role\":"
        "\"system\"},{\"content\":\"a\\nb\",\"role\":\"user\"}],\"model\":\"kjv\","
        "\"stop\":[\"END\"],\"stream\":true,\"temperature\":0.5,\"top_k\":5,\"top_p\":0.5}");
    // a tool round trip: tool_use -> tool_calls, tool_result -> tool messages
    // before the turn's text; thinking -> reasoning_content
    expect_chat(
        "{" M "\"tools\":[{\"name\":\"get_weather\",\"description\":\"d\",\"input_schema\":"
        "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":"
        "true},\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\","
        "\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"s\"},{\"type\":"
        "\"text\",\"text\":\"Let me look.\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":"
        "\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},{\"role\":\"user\",\"content\":[{"
        "\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\","
        "\"text\":\"sunny\"}]},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"content\":"
        "\"boom\",\"is_error\":true},{\"type\":\"text\",\"text\":\"and?\"}]}]}",
        "{\"max_tokens\":8,\"messages\":[{\"content\":\"w?\",\"role\":\"user\"},{\"content\":"
        "\"Let me look.\",\"reasoning_content\":\"hm\",\"role\":\"assistant\",\"tool_calls\":[{"
        "\"function\":{\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"name\":\"get_weather\"},"
        "\"id\":\"toolu_1\",\"type\":\"function\"}]},{\"content\":\"sunny\",\"role\":\"tool\","
        "\"tool_call_id\":\"toolu_1\"},{\"content\":\"Error: boom\",\"role\":\"tool\","
        "\"tool_call_id\":\"toolu_2\"},{\"content\":\"and?\",\"role\":\"user\"}],\"model\":"
        "\"kjv\",\"parallel_tool_calls\":false,\"tool_choice\":\"required\",\"tools\":[{"
        "\"function\":{\"description\":\"d\",\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\"}},\"type\":\"function\"}]}");
    // an assistant turn of tool_use only has null content; tool_choice tool/none/auto
    expect_chat(
        "{" M "\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":"
        "\"tool\",\"name\":\"f\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{"
        "\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":"
        "\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
        "\"tool_use_id\":\"t\"}]}]}",
        "{\"max_tokens\":8,\"messages\":[{\"content\":\"x\",\"role\":\"user\"},{\"content\":"
        "null,\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\","
        "\"name\":\"f\"},\"id\":\"t\",\"type\":\"function\"}]},{\"content\":\"\",\"role\":"
        "\"tool\",\"tool_call_id\":\"t\"}],\"model\":\"kjv\",\"tool_choice\":{\"function\":{"
        "\"name\":\"f\"},\"type\":\"function\"},\"tools\":[{\"function\":{\"name\":\"f\","
        "\"parameters\":{}},\"type\":\"function\"}]}");
    expect_chat("{" M "\"tool_choice\":{\"type\":\"none\"},\"thinking\":{\"type\":\"disabled\"},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                "{\"chat_template_kwargs\":{\"enable_thinking\":false},\"max_tokens\":8,"
                "\"messages\":[{\"content\":\"x\",\"role\":\"user\"}],\"model\":\"kjv\","
                "\"tool_choice\":\"none\"}");
    expect_chat("{\"model\":\"kjv\",\"max_tokens\":2048,\"thinking\":{\"type\":\"enabled\","
                "\"budget_tokens\":1024},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                "{\"chat_template_kwargs\":{\"enable_thinking\":true},\"max_tokens\":2048,"
                "\"messages\":[{\"content\":\"x\",\"role\":\"user\"}],\"model\":\"kjv\"}");

    // refusals, each naming its field as Anthropic's API does
    const char *U = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[1024];
    snprintf(b, sizeof b, "{\"model\":\"kjv\",%s}", U);
    expect_refused(b, 400, "max_tokens: Field required");
    snprintf(b, sizeof b, "{\"max_tokens\":4,%s}", U);
    expect_refused(b, 400, "model: Field required");
    snprintf(b, sizeof b, "{" M "\"max_tokens\":0,%s}", U);
    expect_refused("{\"model\":\"kjv\",\"max_tokens\":0,\"messages\":[]}", 400,
                   "max_tokens: must be an integer >= 1");
    expect_refused("{" M "\"messages\":[]}", 400, "messages: must be a non-empty array");
    expect_refused("{" M "\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400,
                   "messages.0.role: Input should be 'user' or 'assistant' (the system prompt");
    expect_refused("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"n\"}]}",
                   400, "messages.0.name: Extra inputs are not permitted");
    expect_refused("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
                   "\"source\":{}}]}]}",
                   400, "messages.0.content.0.type: 'image' blocks are not supported");
    expect_refused("{" M "\"messages\":[{\"role\":\"user\",\"content\":[]}]}", 400,
                   "messages.0.content: must be a string or a non-empty array");
    expect_refused("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                   "\"assistant\",\"content\":\"The\"}]}",
                   400, "a final assistant message (a prefill");
    expect_refused("{" M "\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":"
                   "\"tool_result\",\"tool_use_id\":\"t\"}]},{\"role\":\"user\",\"content\":"
                   "\"x\"}]}",
                   400,
                   "messages.0.content.0.type: 'tool_result' blocks are not supported in "
                   "assistant");
    expect_refused("{" M "\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":"
                   "\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":\"{}\"}]},{\"role\":"
                   "\"user\",\"content\":\"x\"}]}",
                   400, "messages.0.content.0.input: must be an object, got a string");
    snprintf(b, sizeof b, "{" M "%s,\"temperature\":1.5}", U);
    expect_refused(b, 400, "temperature: must be a number in [0, 1]");
    snprintf(b, sizeof b, "{" M "%s,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", U);
    expect_refused(b, 400, "stop_sequences: at most 4");
    snprintf(b, sizeof b, "{" M "%s,\"stop_sequences\":[\"\"]}", U);
    expect_refused(b, 400, "stop_sequences.0: must be a non-empty string");
    snprintf(b, sizeof b, "{" M "%s,\"frequency_penalty\":1}", U);
    expect_refused(b, 400, "frequency_penalty: Extra inputs are not permitted");
    snprintf(b, sizeof b, "{" M "%s,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}",
             U);
    expect_refused(b, 400, "tools.0.type: 'web_search_20250305' tools");
    snprintf(b, sizeof b, "{" M "%s,\"tools\":[{\"name\":\"f\"}]}", U);
    expect_refused(b, 400, "tools.0.input_schema: Field required");
    snprintf(b, sizeof b, "{" M "%s,\"tool_choice\":{\"type\":\"tool\"}}", U);
    expect_refused(b, 400, "tool_choice.name: Field required");
    snprintf(b, sizeof b, "{" M "%s,\"tool_choice\":{\"type\":\"required\"}}", U);
    expect_refused(b, 400, "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
    snprintf(b, sizeof b, "{" M "%s,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
             U);
    expect_refused(b, 400, "thinking.budget_tokens: must be >= 1024 and less than max_tokens (8)");
    snprintf(b, sizeof b, "{" M "%s,\"thinking\":{\"type\":\"on\"}}", U);
    expect_refused(b, 400, "thinking.type: Input should be 'enabled' or 'disabled'");
    expect_refused("[1]", 400, "the request body must be a JSON object");
}

/* A body whose system has n_sys text blocks and whose user message has
 * n_user text blocks of part_len bytes ("b...b"); malloc'd. */
static char *many_blocks(int n_sys, int n_user, size_t part_len) {
    size_t cap = 256 + (size_t)(n_sys + n_user) * (part_len + 32);
    char *b = malloc(cap), *p = b;
    CHECK(b != NULL);
    p += sprintf(p, "{" M "\"system\":[");
    for (int i = 0; i < n_sys; i++)
        p += sprintf(p, "%s{\"type\":\"text\",\"text\":\"s\"}", i ? "," : "");
    p += sprintf(p, "],\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i < n_user; i++) {
        p += sprintf(p, "%s{\"type\":\"text\",\"text\":\"", i ? "," : "");
        memset(p, 'b', part_len);
        p += part_len;
        p += sprintf(p, "\"}");
    }
    sprintf(p, "]}]}");
    return b;
}

/* Issue 38: blocks are joined in linear time, and their number is bounded
 * over the whole request (system included). */
static void test_many_blocks(void) {
    srv_error err;
    char *b = many_blocks(2, SRV_MAX_CONTENT_PARTS - 2, 256);
    uint64_t t0 = ks_now_ns();
    char *got = translate(b, &err);
    double ms = (double)(ks_now_ns() - t0) * 1e-6;
    if (!got) fprintf(stderr, "refused: %s\n", err.msg);
    CHECK(got != NULL);
    // the user text: the blocks joined by "\n", and the system's "s\ns"
    CHECK_STR_HAS(got, "\"content\":\"s\\ns\",\"role\":\"system\"");
    CHECK_STR_HAS(got, "bbbb\\nbbbb");
    CHECK(strlen(got) > (size_t)(SRV_MAX_CONTENT_PARTS - 2) * 258);
    free(got);
    free(b);
    printf("anthropic: %d blocks of 256 bytes joined in %.1f ms\n", SRV_MAX_CONTENT_PARTS, ms);
    CHECK(ms < 2000); // linear: tens of ms (x10 under sanitizers); quadratic: seconds
    b = many_blocks(2, SRV_MAX_CONTENT_PARTS - 1, 1);
    expect_refused(b, 400, "more than 4096 content blocks");
    free(b);
}

/* srv_anth_parse: the translation then the chat parser; errors of either. */
static void test_parse(void) {
    srv_request r;
    srv_error err;
    const char *ok = "{" M "\"stop_sequences\":[\"Amen\"],\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\"}],\"top_k\":3}";
    CHECK(srv_anth_parse(ok, strlen(ok), &r, &err));
    CHECK_EQ(r.route, SRV_ROUTE_MESSAGES);
    CHECK_EQ(r.max_tokens, 8);
    CHECK_EQ(r.n_stops, 1);
    CHECK_STR_EQ(r.stops[0], "Amen");
    CHECK_STR_EQ(r.model, "kjv");
    CHECK_EQ(r.n_msgs, 1);
    CHECK_EQ(r.sp.top_k, 3);
    srv_request_free(&r);
    const char *bad = "{\"model\":";
    CHECK(!srv_anth_parse(bad, strlen(bad), &r, &err));
    CHECK_EQ(err.status, 400);
    CHECK_STR_HAS(err.msg, "malformed JSON");
    const char *neg = "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":-2}";
    CHECK(!srv_anth_parse(neg, strlen(neg), &r, &err)); // the chat parser's check
    CHECK_EQ(err.status, 400);
    CHECK_STR_HAS(err.msg, "top_k");
}

/* srv_anth_count_parse (count_tokens): a Messages body without max_tokens,
 * thinking's budget included; its errors in Anthropic's envelope, also on
 * the route's own label. */
static void test_count_parse(void) {
    srv_request r;
    srv_error err;
    const char *ok = "{\"model\":\"kjv\",\"system\":\"be brief\",\"messages\":[{\"role\":"
                     "\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"enabled\","
                     "\"budget_tokens\":2048}}";
    CHECK(srv_anth_count_parse(ok, strlen(ok), &r, &err));
    CHECK_EQ(r.route, SRV_ROUTE_MESSAGES);
    CHECK_EQ(r.n_msgs, 2); // the system prompt is the first message
    srv_request_free(&r);
    const char *none = "{\"model\":\"kjv\"}";
    CHECK(!srv_anth_count_parse(none, strlen(none), &r, &err));
    CHECK_EQ(err.status, 400);
    CHECK_STR_HAS(err.msg, "messages");
    char *j = srv_error_json(SRV_ROUTE_COUNT_TOKENS, &err);
    CHECK(j);
    CHECK_STR_HAS(j, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\"");
    free(j);
    CHECK_STR_EQ(srv_route_name(SRV_ROUTE_COUNT_TOKENS), "messages_count_tokens");
    CHECK(srv_dialect_get(srv_route_dialect(SRV_ROUTE_MESSAGES))->key_header != NULL);
    CHECK(srv_dialect_get(srv_route_dialect(SRV_ROUTE_CHAT))->key_header == NULL);
}

// ----------------------------------------------------------------------------
// Answers

static void test_answers(void) {
    const char *stops[] = {"Amen", "\n\n", "Lord"};
    // the first stop to complete wins, not the first in the list
    CHECK_STR_EQ(srv_anth_stop_match("and the Lord said\n\nAmen", 24, stops, 3), "Lord");
    CHECK_STR_EQ(srv_anth_stop_match("so be it. Amen", 14, stops, 3), "Amen");
    CHECK_STR_EQ(srv_anth_stop_match("a\n\nb", 4, stops, 3), "\n\n");
    CHECK(srv_anth_stop_match("nothing here", 12, stops, 3) == NULL);
    CHECK(srv_anth_stop_match("Ame", 3, stops, 3) == NULL);
    CHECK(srv_anth_stop_match(NULL, 0, stops, 3) == NULL);
    // overlapping: "ab" ends at 2 before "bcd" ends at 4
    const char *ov[] = {"bcd", "ab"};
    CHECK_STR_EQ(srv_anth_stop_match("abcd", 4, ov, 2), "ab");

    CHECK_STR_EQ(srv_anth_stop_reason(ENGINE_FINISH_STOP, false, NULL), "end_turn");
    CHECK_STR_EQ(srv_anth_stop_reason(ENGINE_FINISH_STOP, false, "Amen"), "stop_sequence");
    CHECK_STR_EQ(srv_anth_stop_reason(ENGINE_FINISH_STOP, true, NULL), "tool_use");
    CHECK_STR_EQ(srv_anth_stop_reason(ENGINE_FINISH_LENGTH, true, NULL), "max_tokens");
    CHECK(srv_anth_stop_reason(ENGINE_FINISH_ABORT, false, NULL) == NULL);

    static const struct {
        int status;
        const char *type;
    } types[] = {{400, "invalid_request_error"},
                 {401, "authentication_error"},
                 {403, "permission_error"},
                 {404, "not_found_error"},
                 {413, "request_too_large"},
                 {429, "rate_limit_error"},
                 {500, "api_error"},
                 {503, "overloaded_error"},
                 {504, "api_error"},
                 {405, "invalid_request_error"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        CHECK_STR_EQ(srv_anth_error_type(types[i].status), types[i].type);
    srv_error e;
    srv_refuse(&e, ADMIT_MODEL_NOT_FOUND, "model", "The model '%s' does not exist", "x\"y");
    char *j = srv_error_json(SRV_ROUTE_MESSAGES, &e);
    CHECK_STR_EQ(j, "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":"
                    "\"The model 'x\\\"y' does not exist\"}}");
    free(j);
    // Workers AI's OpenAI-compatible route: OpenAI answers, Cloudflare's error envelope
    j = srv_error_json(SRV_ROUTE_WORKERS_CHAT, &e);
    CHECK_STR_HAS(j, "{\"result\":null,\"success\":false,\"errors\":[{\"code\":3042,");
    free(j);
    srv_refuse(&e, ADMIT_INVALID, "x", "bad");
    j = srv_error_json(SRV_ROUTE_WORKERS_CHAT, &e);
    CHECK_STR_HAS(j, "\"errors\":[{\"code\":5006,\"message\":\"bad\"}]");
    free(j);

    char id[64];
    srv_anth_tool_id("call_0123abcd", id, sizeof id);
    CHECK_STR_EQ(id, "toolu_0123abcd");

    json_t *content = json_array();
    json_array_append_new(content, srv_anth_text_block(true, json_string("hm")));
    json_array_append_new(content, srv_anth_text_block(false, json_string("Hi")));
    json_array_append_new(content, srv_anth_tool_block("toolu_1", "f", "{\"a\":1}"));
    json_array_append_new(content, srv_anth_tool_block("toolu_2", "g", "not json"));
    json_t *m = srv_anth_message("msg_1", "kjv", content, "tool_use", NULL, 10, 4, 7);
    char *s = json_dumps(m, JSON_COMPACT);
    CHECK_STR_EQ(s,
                 "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"kjv\","
                 "\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"\"},{"
                 "\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\","
                 "\"name\":\"f\",\"input\":{\"a\":1}},{\"type\":\"tool_use\",\"id\":\"toolu_2\","
                 "\"name\":\"g\",\"input\":{}}],\"stop_reason\":\"tool_use\",\"stop_sequence\":"
                 "null,\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":0,"
                 "\"cache_read_input_tokens\":4,\"output_tokens\":7}}");
    free(s);
    json_decref(m);
}

/* The event names of an SSE text, space-separated, and each data line's
 * "type" equal to its event name. */
static void sse_names(const char *sse, char *out, size_t cap) {
    out[0] = 0;
    for (const char *p = sse; (p = strstr(p, "event: ")); p++) {
        p += 7;
        size_t n = strcspn(p, "\n");
        const char *d = p + n + 1;
        CHECK(!strncmp(d, "data: ", 6));
        json_t *j = json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL);
        CHECK(j);
        const char *t = json_string_value(json_object_get(j, "type"));
        CHECK(t && strlen(t) == n && !strncmp(t, p, n));
        json_decref(j);
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%.*s", l ? " " : "", (int)n, p);
    }
}

static void test_sse(void) {
    srv_buf b = {0};
    srv_anth_sse st = {0};
    CHECK(srv_anth_sse_start(&st, &b, "msg_1", "kjv", 5, 2));
    CHECK(srv_anth_sse_text(&st, &b, true, json_string("plan")));
    CHECK(srv_anth_sse_text(&st, &b, true, json_string(" more")));
    CHECK(srv_anth_sse_text(&st, &b, false, json_string("")));      // nothing
    CHECK(srv_anth_sse_text(&st, &b, false, json_string("Hi")));    // closes thinking
    CHECK(srv_anth_sse_tool(&st, &b, "toolu_1", "f", "{\"a\":1}")); // closes text
    CHECK(srv_anth_sse_end(&st, &b, "tool_use", NULL, 9));
    char names[1024];
    sse_names(b.p, names, sizeof names);
    CHECK_STR_EQ(names, "message_start ping content_block_start content_block_delta "
                        "content_block_delta content_block_stop content_block_start "
                        "content_block_delta content_block_stop content_block_start "
                        "content_block_delta content_block_stop message_delta message_stop");
    CHECK_STR_HAS(b.p, "\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"");
    CHECK_STR_HAS(b.p, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
                       "\"thinking_delta\",\"thinking\":\" more\"}}");
    CHECK_STR_HAS(b.p, "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":"
                       "\"text_delta\",\"text\":\"Hi\"}}");
    CHECK_STR_HAS(b.p, "\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\","
                       "\"name\":\"f\",\"input\":{}}");
    CHECK_STR_HAS(b.p, "\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
                       "\"{\\\"a\\\":1}\"}");
    CHECK_STR_HAS(b.p, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\","
                       "\"stop_sequence\":null},\"usage\":{\"input_tokens\":3,");
    CHECK_STR_HAS(b.p, "\"output_tokens\":9}}");
    // message_delta's input usage is message_start's, always
    CHECK_STR_HAS(b.p, "\"usage\":{\"input_tokens\":3,\"cache_creation_input_tokens\":0,"
                       "\"cache_read_input_tokens\":2,\"output_tokens\":0}}}");
    CHECK_STR_HAS(b.p, "\"usage\":{\"input_tokens\":3,\"cache_creation_input_tokens\":0,"
                       "\"cache_read_input_tokens\":2,\"output_tokens\":9}}");
    srv_buf_free(&b);
    // nothing said: still one (empty) text block, as the non-streamed message
    srv_anth_sse st0 = {0};
    CHECK(srv_anth_sse_end(&st0, &b, "end_turn", NULL, 1));
    sse_names(b.p, names, sizeof names);
    CHECK_STR_EQ(names, "content_block_start content_block_stop message_delta message_stop");
    CHECK_STR_HAS(b.p, "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}");
    srv_buf_free(&b);
    srv_error e;
    srv_fail(&e, 503, "request_aborted", "aborted");
    CHECK(srv_anth_sse_error(&b, &e));
    CHECK_STR_EQ(b.p, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                      "\"overloaded_error\",\"message\":\"aborted\"}}\n\n");
    srv_buf_free(&b);
}

// ----------------------------------------------------------------------------
// Through the HTTP front: a scripted backend writes TEXT in 3-byte pieces

static const char TEXT[] = "<think>plan</think>\n<tool_call>\n{\"name\": \"get_weather\", "
                           "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
#define PIECE 3

typedef struct fake_req {
    int next, n_events;
    bool fail; /* max_tokens 7: aborted after two pieces */
} fake_req;

static ks_err fake_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    (void)impl, (void)eb, (void)p;
    fake_req *r = calloc(1, sizeof *r);
    CHECK(r);
    r->n_events = (int)((strlen(TEXT) + PIECE - 1) / PIECE);
    if ((r->fail = p->max_tokens == 7)) r->n_events = 2;
    *req = r;
    return KS_OK;
}

static ks_err fake_next(void *req, engine_event *ev, uint32_t timeout_ms) {
    (void)timeout_ms;
    fake_req *r = req;
    if (r->next > r->n_events) return KS_ERR_CANCELLED;
    memset(ev, 0, sizeof *ev);
    ev->n_prompt = 2;
    if (r->next < r->n_events) {
        size_t at = (size_t)r->next * PIECE, n = strlen(TEXT) - at;
        if (n > PIECE) n = PIECE;
        memcpy(ev->text, TEXT + at, n);
        ev->text_len = n;
        ev->token = 100;
    } else {
        ev->done = true;
        ev->token = -1;
        ev->state = r->fail ? ENGINE_ABORTED : ENGINE_FINISHED;
        ev->finish = r->fail ? ENGINE_FINISH_ABORT : ENGINE_FINISH_STOP;
        ev->err = r->fail ? KS_ERR_CANCELLED : KS_OK;
        ev->n_gen = r->n_events;
    }
    r->next++;
    return KS_OK;
}

static void fake_set_notify(void *req, void (*fn)(void *), void *ctx) {
    (void)req, (void)fn, (void)ctx;
}
static void fake_cancel(void *req) { (void)req; }
static void fake_release(void *req) { free(req); }
static bool fake_is_online(void *impl) { return (void)impl, true; }
static void fake_set_online(void *impl, bool online, bool abort_running) {
    (void)impl, (void)online, (void)abort_running;
}
static void fake_get_stats(void *impl, engine_stats *out) {
    (void)impl;
    memset(out, 0, sizeof *out);
}
static ks_err fake_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    (void)impl, (void)timeout_ms, (void)eb;
    return KS_OK;
}

static char g_raw[1 << 17];

/* POSTs body to /v1/messages with header hdr ("" none); the status, *out the body. */
static int post(int port, const char *hdr, const char *body, const char **out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "POST /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     hdr, strlen(body), body);
    CHECK(n > 0 && (size_t)n < sizeof req);
    CHECK_EQ(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t k;
    while ((k = read(fd, g_raw + got, sizeof g_raw - 1 - got)) > 0)
        got += (size_t)k;
    g_raw[got] = 0;
    close(fd);
    int status = 0;
    CHECK_EQ(sscanf(g_raw, "HTTP/1.1 %d", &status), 1);
    const char *b = strstr(g_raw, "\r\n\r\n");
    *out = b ? b + 4 : "";
    return status;
}

#define KEY "x-api-key: sk-anth-1\r\n"
#define REQ(stream)                                                                                \
    "{\"model\":\"kjv\",\"max_tokens\":64,\"stream\":" stream ",\"tools\":[{\"name\":"             \
    "\"get_weather\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"    \
    "\"string\"}}}}],\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}]}"

/* The streamed answer's blocks, added up as a client does: by index,
 * text/thinking deltas joined, input_json_delta parsed at the block's end. */
static json_t *sse_blocks(const char *sse, const char **stop_reason) {
    json_t *blocks = json_array();
    static char reason[32];
    reason[0] = 0;
    for (const char *p = sse; (p = strstr(p, "\ndata: ")); p++) {
        json_t *j = json_loadb(p + 7, strcspn(p + 7, "\n"), 0, NULL);
        CHECK(j);
        const char *t = json_string_value(json_object_get(j, "type"));
        size_t idx = (size_t)json_integer_value(json_object_get(j, "index"));
        if (!strcmp(t, "content_block_start")) {
            CHECK_EQ(idx, json_array_size(blocks)); // in order, from 0
            json_array_append(blocks, json_object_get(j, "content_block"));
        } else if (!strcmp(t, "content_block_delta")) {
            json_t *blk = json_array_get(blocks, idx), *d = json_object_get(j, "delta");
            const char *dt = json_string_value(json_object_get(d, "type"));
            const char *key = !strcmp(dt, "text_delta")       ? "text"
                              : !strcmp(dt, "thinking_delta") ? "thinking"
                                                              : "partial_json";
            const char *have = json_string_value(json_object_get(blk, key));
            char *cat = NULL;
            CHECK(asprintf(&cat, "%s%s", have ? have : "",
                           json_string_value(json_object_get(d, key))) >= 0);
            json_object_set_new(blk, key, json_string(cat));
            free(cat);
        } else if (!strcmp(t, "content_block_stop")) {
            json_t *blk = json_array_get(blocks, idx), *pj = json_object_get(blk, "partial_json");
            if (pj) {
                json_object_set_new(blk, "input", json_loads(json_string_value(pj), 0, NULL));
                json_object_del(blk, "partial_json");
            }
        } else if (!strcmp(t, "message_delta")) {
            snprintf(
                reason, sizeof reason, "%s",
                json_string_value(json_object_get(json_object_get(j, "delta"), "stop_reason")));
        }
        json_decref(j);
    }
    *stop_reason = reason;
    return blocks;
}

static void test_http(void) {
    const char *src = getenv("KS_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/kjv-mini.gguf", src ? src : ".");
    ks_errbuf eb;
    model *m;
    if (model_load(path, &m, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        abort();
    }
    server_backend b = {.submit = fake_submit,
                        .next = fake_next,
                        .cancel = fake_cancel,
                        .release = fake_release,
                        .set_notify = fake_set_notify,
                        .is_online = fake_is_online,
                        .set_online = fake_set_online,
                        .get_stats = fake_get_stats,
                        .check_quiescent = fake_check};
    server_opts o;
    server_opts_default(&o);
    o.port = 0;
    o.n_ctx = 512;
    o.model_name = "kjv";
    o.tool_call_format = TOOLCALL_HERMES;
    o.reasoning_format = 1; // <think> ... </think>
    char tmpl[64], tenants[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/ks_test_anth_%d.jinja", (int)getpid());
    snprintf(tenants, sizeof tenants, "/tmp/ks_test_anth_%d.json", (int)getpid());
    FILE *f = fopen(tmpl, "w");
    CHECK(f);
    fputs("{{- bos_token }}{% for m in messages %}User: {{ m.content }}\nAssistant:{% endfor %}",
          f);
    fclose(f);
    f = fopen(tenants, "w");
    CHECK(f);
    fputs("{\"tenants\":[{\"name\":\"acme\",\"keys\":[\"sk-anth-1\"]}]}", f);
    fclose(f);
    o.chat_template_file = tmpl;
    o.tenants_path = tenants;
    server *s;
    CHECK(server_create_backend(&o, &b, m, &s, &eb) == KS_OK);
    unlink(tmpl);
    unlink(tenants);
    int port = server_port(s);
    const char *body;

    // not streamed: thinking, then the call as tool_use (no whitespace-only text)
    CHECK_EQ(post(port, KEY, REQ("false"), &body), 200);
    json_t *j = json_loads(body, 0, NULL);
    CHECK(j);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "type")), "message");
    CHECK(!strncmp(json_string_value(json_object_get(j, "id")), "msg_", 4));
    CHECK_STR_EQ(json_string_value(json_object_get(j, "stop_reason")), "tool_use");
    json_t *c = json_object_get(j, "content");
    CHECK_EQ(json_array_size(c), 2);
    json_t *tu = json_array_get(c, 1);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(c, 0), "thinking")), "plan");
    CHECK_STR_EQ(json_string_value(json_object_get(tu, "type")), "tool_use");
    CHECK_STR_EQ(json_string_value(json_object_get(tu, "name")), "get_weather");
    CHECK(!strncmp(json_string_value(json_object_get(tu, "id")), "toolu_", 6));
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(tu, "input"), "city")), "Paris");
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")), 2);
    // streamed: the same blocks, event by event
    CHECK_EQ(post(port, KEY, REQ("true"), &body), 200);
    CHECK_STR_HAS(g_raw, "Content-Type: text/event-stream");
    CHECK(strstr(body, "event: ") == strstr(body, "event: message_start\n")); // (chunked)
    const char *reason;
    json_t *sb = sse_blocks(body, &reason);
    CHECK_STR_EQ(reason, "tool_use");
    json_object_del(json_array_get(sb, 1), "id");
    json_object_del(tu, "id");
    json_object_del(json_array_get(c, 0), "signature");
    json_object_del(json_array_get(sb, 0), "signature");
    CHECK(json_equal(sb, c));
    json_decref(sb);
    json_decref(j);
    // Authorization: Bearer works too; the same key in both is fine
    CHECK_EQ(post(port, "Authorization: Bearer sk-anth-1\r\n" KEY, REQ("false"), &body), 200);
    // keys: wrong 401, missing 401, two different ones 400 — Anthropic's error shape
    CHECK_EQ(post(port, "x-api-key: nope\r\n", REQ("false"), &body), 401);
    CHECK_STR_EQ(body, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
                       "\"message\":\"invalid API key\"}}");
    CHECK_EQ(post(port, "", REQ("false"), &body), 401);
    CHECK_STR_HAS(body, "missing API key: send the header 'x-api-key: <key>'");
    CHECK_EQ(post(port, "Authorization: Bearer other\r\n" KEY, REQ("false"), &body), 400);
    CHECK_STR_HAS(body, "x-api-key and Authorization carry different keys");
    CHECK_EQ(post(port, KEY, "{\"model\":\"kjv\",\"messages\":[]}", &body), 400);
    CHECK_STR_HAS(body, "\"type\":\"invalid_request_error\",\"message\":\"max_tokens: Field");
    CHECK_EQ(post(port, KEY,
                  "{\"model\":\"claude-x\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\","
                  "\"content\":\"x\"}]}",
                  &body),
             404);
    CHECK_STR_HAS(body, "\"type\":\"not_found_error\",\"message\":\"The model 'claude-x'");
    // aborted after the stream started: an error event ends it (no message_stop);
    // not streamed: 503 overloaded_error
    const char *ab = "{\"model\":\"kjv\",\"max_tokens\":7,\"stream\":true,\"messages\":[{"
                     "\"role\":\"user\",\"content\":\"x\"}]}";
    CHECK_EQ(post(port, KEY, ab, &body), 200);
    CHECK_STR_HAS(body, "event: content_block_delta\n");
    CHECK_STR_HAS(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                        "\"overloaded_error\",\"message\":\"the request was aborted");
    CHECK(!strstr(body, "message_stop"));
    const char *ab1 = "{\"model\":\"kjv\",\"max_tokens\":7,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"x\"}]}";
    CHECK_EQ(post(port, KEY, ab1, &body), 503);
    CHECK_STR_HAS(body, "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"");
    server_destroy(s);
    model_free(m);
}

int main(void) {
    test_translate();
    test_parse();
    test_count_parse();
    test_many_blocks();
    test_answers();
    test_sse();
    test_http();
    printf("server anthropic ok\n");
    return 0;
}
