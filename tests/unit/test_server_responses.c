/* test_server_responses.c — OpenAI's Responses API (src/server/responses.c):
 * - the pure translation: a Responses body -> the OpenAI chat body it means
 *   (instructions, input items: messages, function_call merged into the
 *   assistant turn, function_call_output, reasoning as the next assistant
 *   turn's reasoning_content; tools, tool_choice, text.format,
 *   max_output_tokens), the previous response's items first, the echoed
 *   parameters, and each refusal with its field named;
 * - srv_resp_parse: chat-layer errors renamed to the Responses fields, an
 *   unknown or another tenant's previous_response_id alike;
 * - the store: per-tenant isolation, count and byte bounds evicting the
 *   tenant's oldest only, the TTL, delete;
 * - the output builder: items and the SSE events (sequence numbers, order,
 *   an empty answer still one message). */
#include "../check.h"
#include "server/server_int.h"

#include <jansson.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Translation

/* srv_resp_to_chat of body (prev: JSON items or NULL) as compact sorted
 * JSON (caller frees), or NULL with *err filled. */
static char *translate(const char *body, const char *prev, srv_error *err) {
    json_t *root = json_loads(body, 0, NULL), *pv = prev ? json_loads(prev, 0, NULL) : NULL;
    CHECK(root);
    memset(err, 0, sizeof *err);
    srv_resp_req x;
    json_t *chat = srv_resp_to_chat(root, pv, &x, err);
    json_decref(root);
    json_decref(pv);
    if (!chat) return NULL;
    CHECK(x.echo && x.items);
    srv_resp_req_free(&x);
    char *s = json_dumps(chat, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(chat);
    return s;
}

static void expect_chat(const char *body, const char *prev, const char *want) {
    srv_error err;
    char *got = translate(body, prev, &err);
    if (!got) fprintf(stderr, "refused: %s\n", err.msg);
    CHECK(got);
    CHECK_STR_EQ(got, want);
    free(got);
}

static void expect_refused(const char *body, const char *param, const char *msg_part) {
    srv_error err;
    char *got = translate(body, NULL, &err);
    if (got) fprintf(stderr, "accepted: %s\n", got);
    CHECK(!got);
    CHECK_EQ(err.status, 400);
    CHECK_STR_EQ(err.param, param);
    if (msg_part && !strstr(err.msg, msg_part)) fprintf(stderr, "message: %s\n", err.msg);
    CHECK(!msg_part || strstr(err.msg, msg_part));
}

static void test_translate(void) {
    expect_chat("{\"model\":\"m\",\"input\":\"hi\",\"max_output_tokens\":5,\"temperature\":0,"
                "\"stream\":true}",
                NULL,
                "{\"max_tokens\":5,\"messages\":[{\"content\":\"hi\",\"role\":\"user\"}],"
                "\"model\":\"m\",\"stream\":true,\"temperature\":0}");
    // instructions first; parts as chat text parts; developer kept
    expect_chat("{\"instructions\":\"sys\",\"input\":[{\"role\":\"developer\",\"content\":\"d\"},"
                "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
                "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]}]}",
                NULL,
                "{\"messages\":[{\"content\":\"sys\",\"role\":\"system\"},{\"content\":\"d\","
                "\"role\":\"developer\"},{\"content\":[{\"text\":\"a\",\"type\":\"text\"},"
                "{\"text\":\"b\",\"type\":\"text\"}],\"role\":\"user\"}]}");
    // reasoning -> the assistant turn's reasoning_content; calls join that turn;
    // outputs become tool messages
    expect_chat(
        "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"id\":\"rs_1\","
        "\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}]},{\"type\":\"message\","
        "\"id\":\"msg_1\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"ok\",\"annotations\":[]}]},{\"type\":\"function_call\","
        "\"id\":\"fc_1\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
        "\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"c2\",\"output\":\"r2\"}]}",
        NULL,
        "{\"messages\":[{\"content\":\"q\",\"role\":\"user\"},{\"content\":[{\"text\":\"ok\","
        "\"type\":\"text\"}],\"reasoning_content\":\"think\",\"role\":\"assistant\","
        "\"tool_calls\":[{\"function\":{\"arguments\":\"{}\",\"name\":\"f\"},\"id\":\"c1\","
        "\"type\":\"function\"},{\"function\":{\"arguments\":\"{\\\"a\\\":1}\",\"name\":\"g\"},"
        "\"id\":\"c2\",\"type\":\"function\"}]},{\"content\":\"r1\",\"role\":\"tool\","
        "\"tool_call_id\":\"c1\"},{\"content\":\"r2\",\"role\":\"tool\",\"tool_call_id\":\"c2\"}]"
        "}");
    // a call with no assistant turn before it: its own turn, content null
    expect_chat("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"function_call\","
                "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
                NULL,
                "{\"messages\":[{\"content\":\"q\",\"role\":\"user\"},{\"content\":null,"
                "\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\","
                "\"name\":\"f\"},\"id\":\"c\",\"type\":\"function\"}]}]}");
    // the previous response's items come first (after instructions)
    expect_chat("{\"instructions\":\"i\",\"input\":\"two\"}",
                "[{\"type\":\"message\",\"role\":\"user\",\"content\":\"one\"},{\"type\":"
                "\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
                "\"text\":\"a\"}]}]",
                "{\"messages\":[{\"content\":\"i\",\"role\":\"system\"},{\"content\":\"one\","
                "\"role\":\"user\"},{\"content\":[{\"text\":\"a\",\"type\":\"text\"}],\"role\":"
                "\"assistant\"},{\"content\":\"two\",\"role\":\"user\"}]}");
    // tools, tool_choice, text.format
    expect_chat("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":"
                "\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],\"tool_choice\":{"
                "\"type\":\"function\",\"name\":\"f\"},\"parallel_tool_calls\":false,\"text\":{"
                "\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":{\"type\":"
                "\"object\"},\"strict\":true}}}",
                NULL,
                "{\"messages\":[{\"content\":\"x\",\"role\":\"user\"}],\"parallel_tool_calls\":"
                "false,\"response_format\":{\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":"
                "\"object\"},\"strict\":true},\"type\":\"json_schema\"},\"tool_choice\":{"
                "\"function\":{\"name\":\"f\"},\"type\":\"function\"},\"tools\":[{\"function\":{"
                "\"description\":\"d\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"},"
                "\"strict\":true},\"type\":\"function\"}]}");
    expect_chat("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}},\"store\":false,"
                "\"metadata\":{\"k\":\"v\"},\"user\":\"u\",\"reasoning\":{\"effort\":\"low\"},"
                "\"include\":[\"reasoning.encrypted_content\"],\"truncation\":\"disabled\"}",
                NULL,
                "{\"messages\":[{\"content\":\"x\",\"role\":\"user\"}],\"response_format\":{"
                "\"type\":\"json_object\"}}");

    expect_refused("{\"model\":\"m\"}", "input", "'input' is required");
    expect_refused("{\"input\":[]}", "input", "must not be empty");
    expect_refused("{\"input\":{}}", "input", "a string or an array");
    expect_refused("{\"input\":\"x\",\"background\":true}", "background", "'background'");
    expect_refused("{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0].role",
                   "input[0].role");
    expect_refused("{\"input\":[5]}", "input[0]", "must be an object");
    expect_refused("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0].type",
                   "'item_reference' items are not supported");
    expect_refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
                   "input[0].content[0]", "'input_image' content is not supported");
    expect_refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}",
                   "input[0].content[0]", "text: must be a string");
    expect_refused("{\"input\":[{\"role\":\"user\"}]}", "input[0].content", "is required");
    expect_refused("{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}",
                   "input[0].arguments", "must be a string");
    expect_refused("{\"input\":[{\"type\":\"function_call_output\",\"output\":\"o\"}]}",
                   "input[0].call_id", "must be a string");
    expect_refused("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type",
                   "only function tools");
    expect_refused("{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name",
                   "must be a string");
    expect_refused("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"x\":1}]}",
                   "tools[0]", "tools[0].x");
    expect_refused("{\"input\":\"x\",\"tool_choice\":{\"type\":\"mcp\"}}", "tool_choice", NULL);
    expect_refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type",
                   "'xml'");
    expect_refused("{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", "[1, ");
    expect_refused("{\"input\":\"x\",\"store\":1}", "store", "boolean");
    expect_refused("{\"input\":\"x\",\"metadata\":{\"a\":1}}", "metadata", NULL);
    expect_refused("{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation", "never cut");
    expect_refused("{\"input\":\"x\",\"include\":[\"file_search_call.results\"]}", "include[0]",
                   NULL);
    expect_refused("{\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id",
                   "string");

    // the echoed parameters: the request's, else OpenAI's defaults
    json_t *root =
        json_loads("{\"input\":\"x\",\"temperature\":0.5,\"metadata\":{\"k\":\"v\"}}", 0, NULL);
    srv_resp_req x;
    srv_error err;
    json_t *chat = srv_resp_to_chat(root, NULL, &x, &err);
    CHECK(chat);
    CHECK(x.store);
    CHECK(json_real_value(json_object_get(x.echo, "temperature")) == 0.5);
    CHECK(json_real_value(json_object_get(x.echo, "top_p")) == 1.0);
    CHECK(json_is_null(json_object_get(x.echo, "instructions")));
    CHECK_STR_EQ(json_string_value(json_object_get(x.echo, "tool_choice")), "auto");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(x.echo, "metadata"), "k")), "v");
    CHECK_EQ(json_array_size(x.items), 1); // the string input as a user message item
    json_t *r =
        srv_resp_object(x.echo, "resp_1", 7, "m", "incomplete", NULL, srv_resp_usage(10, 4, 3, 1));
    CHECK(r);
    CHECK_STR_EQ(json_string_value(json_object_get(r, "object")), "response");
    CHECK_STR_EQ(
        json_string_value(json_object_get(json_object_get(r, "incomplete_details"), "reason")),
        "max_output_tokens");
    json_t *u = json_object_get(r, "usage");
    CHECK_EQ(json_integer_value(json_object_get(u, "total_tokens")), 13);
    CHECK_EQ(json_integer_value(
                 json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")),
             4);
    CHECK_EQ(json_integer_value(
                 json_object_get(json_object_get(u, "output_tokens_details"), "reasoning_tokens")),
             1);
    json_decref(r);
    json_decref(chat);
    json_decref(root);
    srv_resp_req_free(&x);
}

// ----------------------------------------------------------------------------
// srv_resp_parse and the store

static void test_parse_and_store(void) {
    srv_resp_store *st = srv_resp_store_create(2, 1 << 20, 60);
    CHECK(st);
    json_t *resp = json_pack("{s:s}", "id", "resp_a"),
           *conv = json_loads("[{\"type\":\"message\",\"role\":\"user\",\"content\":\"one\"}]", 0,
                              NULL);
    uint64_t t0 = 1000000000ull;
    CHECK_EQ(srv_resp_store_put(st, "acme", "resp_a", resp, conv, t0), KS_OK);
    srv_request rq;
    srv_resp_req x;
    srv_error err;
    const char *body = "{\"model\":\"m\",\"input\":\"two\",\"previous_response_id\":\"resp_a\"}";
    CHECK(srv_resp_parse(body, strlen(body), st, "acme", t0, &rq, &x, &err));
    CHECK_EQ(rq.route, SRV_ROUTE_RESPONSES);
    CHECK_EQ(rq.n_msgs, 2);
    CHECK_EQ(json_array_size(x.items), 2); // the stored item, then the new input
    srv_request_free(&rq);
    srv_resp_req_free(&x);
    // another tenant's id is the unknown id's 400
    CHECK(!srv_resp_parse(body, strlen(body), st, "beta", t0, &rq, &x, &err));
    CHECK_EQ(err.status, 400);
    CHECK_STR_EQ(err.code, "previous_response_not_found");
    CHECK_STR_EQ(err.param, "previous_response_id");
    // chat-layer errors name the Responses field
    const char *b2 = "{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_"
                     "schema\",\"name\":\"s\","
                     "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                     "\"pattern\":5}}}}}}";
    CHECK(!srv_resp_parse(b2, strlen(b2), st, "acme", t0, &rq, &x, &err));
    CHECK(!strncmp(err.param, "text.format", 11));
    CHECK(!strstr(err.msg, "response_format"));
    const char *b3 = "{\"model\":\"m\",\"input\":\"x\",\"temperature\":\"hot\"}";
    CHECK(!srv_resp_parse(b3, strlen(b3), st, "acme", t0, &rq, &x, &err));
    CHECK_STR_EQ(err.param, "temperature");
    const char *b4 =
        "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"a b\"}]}";
    CHECK(!srv_resp_parse(b4, strlen(b4), st, "acme", t0, &rq, &x, &err));
    CHECK_STR_EQ(err.param, "tools[0].name");
    CHECK(!strstr(err.msg, "function.name"));

    // isolation: beta sees nothing of acme's, cannot delete it
    CHECK(srv_resp_store_get(st, "beta", "resp_a", false, t0) == NULL);
    CHECK(!srv_resp_store_delete(st, "beta", "resp_a", t0));
    json_t *g = srv_resp_store_get(st, "acme", "resp_a", false, t0);
    CHECK(g);
    json_decref(g);
    // count: acme's third evicts acme's oldest; beta's never count against acme
    CHECK_EQ(srv_resp_store_put(st, "beta", "resp_b1", resp, conv, t0 + 1), KS_OK);
    CHECK_EQ(srv_resp_store_put(st, "beta", "resp_b2", resp, conv, t0 + 2), KS_OK);
    CHECK_EQ(srv_resp_store_put(st, "acme", "resp_a2", resp, conv, t0 + 3), KS_OK);
    CHECK_EQ(srv_resp_store_put(st, "acme", "resp_a3", resp, conv, t0 + 4), KS_OK);
    CHECK(srv_resp_store_get(st, "acme", "resp_a", false, t0 + 5) == NULL);
    // beta's are now the oldest in the store, and still acme's fourth evicts acme's
    CHECK_EQ(srv_resp_store_put(st, "acme", "resp_a4", resp, conv, t0 + 5), KS_OK);
    CHECK(srv_resp_store_get(st, "acme", "resp_a2", false, t0 + 5) == NULL);
    g = srv_resp_store_get(st, "beta", "resp_b1", true, t0 + 5);
    CHECK(json_is_array(g));
    json_decref(g);
    size_t n, bytes;
    srv_resp_store_usage(st, "acme", t0 + 5, &n, &bytes);
    CHECK_EQ(n, 2);
    CHECK(bytes > 0);
    // delete
    CHECK(srv_resp_store_delete(st, "acme", "resp_a4", t0 + 5));
    CHECK(srv_resp_store_get(st, "acme", "resp_a4", false, t0 + 5) == NULL);
    CHECK(!srv_resp_store_delete(st, "acme", "resp_a4", t0 + 5));
    // TTL: gone 60 s after it was stored
    g = srv_resp_store_get(st, "acme", "resp_a3", false, t0 + 59000000000ull);
    CHECK(g);
    json_decref(g);
    CHECK(srv_resp_store_get(st, "acme", "resp_a3", false, t0 + 4 + 60000000000ull) == NULL);
    srv_resp_store_usage(st, "beta", t0 + 61000000000ull, &n, &bytes);
    CHECK_EQ(n, 0);
    srv_resp_store_destroy(st);

    // bytes: the oldest goes until the new one fits; one too large is not kept
    size_t one = strlen("{\"id\":\"resp_a\"}") +
                 strlen("[{\"type\":\"message\",\"role\":\"user\",\"content\":\"one\"}]");
    st = srv_resp_store_create(100, 2 * one + 1, 60);
    CHECK_EQ(srv_resp_store_put(st, "acme", "r1", resp, conv, t0), KS_OK);
    CHECK_EQ(srv_resp_store_put(st, "acme", "r2", resp, conv, t0 + 1), KS_OK);
    CHECK_EQ(srv_resp_store_put(st, "acme", "r3", resp, conv, t0 + 2), KS_OK);
    CHECK(srv_resp_store_get(st, "acme", "r1", false, t0 + 3) == NULL);
    g = srv_resp_store_get(st, "acme", "r2", false, t0 + 3);
    CHECK(g);
    json_decref(g);
    srv_resp_store_destroy(st);
    st = srv_resp_store_create(100, one - 1, 60);
    CHECK_EQ(srv_resp_store_put(st, "acme", "r1", resp, conv, t0), KS_ERR_NOSPACE);
    srv_resp_store_destroy(st);
    json_decref(resp);
    json_decref(conv);
}

// ----------------------------------------------------------------------------
// The output builder

static void test_out(void) {
    srv_buf b = {0};
    srv_resp_out o = {0};
    json_t *start = json_pack("{s:s}", "status", "in_progress");
    CHECK(srv_resp_out_start(&o, &b, start));
    CHECK(srv_resp_out_text(&o, true, "hm", 2));
    CHECK(srv_resp_out_text(&o, false, "Hel", 3));
    CHECK(srv_resp_out_text(&o, false, "lo", 2));
    CHECK(srv_resp_out_call(&o, "call_1", "f", "{\"a\":1}"));
    CHECK(srv_resp_out_close(&o));
    json_t *fin = json_pack("{s:s}", "status", "completed");
    CHECK(srv_resp_out_end(&o, fin));
    // the items: reasoning, message "Hello", the call
    CHECK_EQ(json_array_size(o.output), 3);
    json_t *it = json_array_get(o.output, 0);
    CHECK_STR_EQ(json_string_value(json_object_get(it, "type")), "reasoning");
    CHECK_STR_EQ(json_string_value(
                     json_object_get(json_array_get(json_object_get(it, "summary"), 0), "text")),
                 "hm");
    it = json_array_get(o.output, 1);
    CHECK_STR_EQ(json_string_value(
                     json_object_get(json_array_get(json_object_get(it, "content"), 0), "text")),
                 "Hello");
    it = json_array_get(o.output, 2);
    CHECK_STR_EQ(json_string_value(json_object_get(it, "call_id")), "call_1");
    CHECK_STR_EQ(json_string_value(json_object_get(it, "arguments")), "{\"a\":1}");
    // the events, in order, numbered from 0
    static const char *const want[] = {"response.created",
                                       "response.in_progress",
                                       "response.output_item.added",
                                       "response.reasoning_summary_part.added",
                                       "response.reasoning_summary_text.delta",
                                       "response.reasoning_summary_text.done",
                                       "response.reasoning_summary_part.done",
                                       "response.output_item.done",
                                       "response.output_item.added",
                                       "response.content_part.added",
                                       "response.output_text.delta",
                                       "response.output_text.delta",
                                       "response.output_text.done",
                                       "response.content_part.done",
                                       "response.output_item.done",
                                       "response.output_item.added",
                                       "response.function_call_arguments.delta",
                                       "response.function_call_arguments.done",
                                       "response.output_item.done",
                                       "response.completed",
                                       NULL};
    const char *p = b.p;
    int k = 0;
    for (; want[k]; k++) {
        char line[128];
        snprintf(line, sizeof line, "event: %s\ndata: {", want[k]);
        CHECK(!strncmp(p, line, strlen(line)));
        const char *data = p + strlen(line) - 1, *end = strstr(data, "\n\n");
        CHECK(end);
        json_t *j = json_loadb(data, (size_t)(end - data), 0, NULL);
        CHECK(j);
        CHECK_EQ(json_integer_value(json_object_get(j, "sequence_number")), k);
        CHECK_STR_EQ(json_string_value(json_object_get(j, "type")), want[k]);
        json_decref(j);
        p = end + 2;
    }
    CHECK_EQ(*p, 0);
    srv_resp_out_free(&o);
    srv_buf_free(&b);

    // nothing generated: still one (empty) message; no events without a buffer
    CHECK(srv_resp_out_start(&o, NULL, start));
    CHECK(srv_resp_out_text(&o, false, "", 0));
    CHECK(srv_resp_out_close(&o));
    CHECK_EQ(json_array_size(o.output), 1);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(o.output, 0), "type")),
                 "message");
    CHECK_EQ(o.seq, 0);
    srv_resp_out_free(&o);
    // whitespace before a call is no message (the chat route's content null);
    // before text it leads the text; alone it is the answer
    CHECK(srv_resp_out_text(&o, false, "\n", 1));
    CHECK(srv_resp_out_call(&o, "call_2", "f", "{}"));
    CHECK(srv_resp_out_close(&o));
    CHECK_EQ(json_array_size(o.output), 1);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(o.output, 0), "type")),
                 "function_call");
    srv_resp_out_free(&o);
    CHECK(srv_resp_out_text(&o, false, " ", 1));
    CHECK(srv_resp_out_text(&o, false, "\n", 1));
    CHECK(srv_resp_out_text(&o, false, "a\xff", 2)); // a lone byte becomes U+FFFD
    CHECK(srv_resp_out_close(&o));
    CHECK_STR_EQ(
        json_string_value(json_object_get(
            json_array_get(json_object_get(json_array_get(o.output, 0), "content"), 0), "text")),
        " \na\xef\xbf\xbd");
    srv_resp_out_free(&o);
    CHECK(srv_resp_out_text(&o, false, "  ", 2));
    CHECK(srv_resp_out_close(&o));
    CHECK_STR_EQ(
        json_string_value(json_object_get(
            json_array_get(json_object_get(json_array_get(o.output, 0), "content"), 0), "text")),
        "  ");
    srv_resp_out_free(&o);
    json_decref(start);
    json_decref(fin);
}

int main(void) {
    test_translate();
    test_parse_and_store();
    test_out();
    printf("server responses ok\n");
    return 0;
}
