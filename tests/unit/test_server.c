/* test_server.c — the pure parts of the server module: request JSON ->
 * validated parameters (and the 400s with their param and message),
 * OpenAI / Workers-AI error shapes, SSE framing, tenants file parsing, key
 * lookup and per-tenant limits, and the Prometheus text format. The HTTP
 * routes against the real engine are covered by tests/e2e/test_serve_*.sh. */
#include "../check.h"
#include "server/server_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Helpers

/* Parses body for route and expects a 400 naming param (NULL: JSON null)
 * whose message contains needle. */
static void expect_invalid(srv_route route, const char *body, const char *param, const char *code,
                           const char *needle) {
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse(route, body, strlen(body), &r, &e)) {
        fprintf(stderr, "accepted: %s\n", body);
        CHECK(!"invalid body accepted");
    }
    CHECK_EQ(e.status, 400);
    CHECK_STR_EQ(e.param, param ? param : "");
    if (code) CHECK_STR_EQ(e.code, code);
    CHECK_STR_HAS(e.msg, needle);
    CHECK(r.root == NULL && r.msgs == NULL); // nothing left allocated
}

static srv_request parse_ok(srv_route route, const char *body) {
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (!srv_request_parse(route, body, strlen(body), &r, &e)) {
        fprintf(stderr, "rejected: %s -> %s\n", body, e.msg);
        CHECK(!"valid body rejected");
    }
    return r;
}

// ----------------------------------------------------------------------------
// Requests

static void test_request_valid(void) {
    srv_request r = parse_ok(
        SRV_ROUTE_COMPLETIONS,
        "{\"model\":\"kjv\",\"prompt\":\"In the beginning\",\"max_tokens\":60,\"temperature\":0,"
        "\"top_p\":0.9,\"top_k\":5,\"min_p\":0.1,\"seed\":42,\"stop\":[\"a\",\"bc\"],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":3,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,"
        "\"n\":1,\"user\":\"u\"}");
    CHECK_STR_EQ(r.model, "kjv");
    CHECK_STR_EQ(r.prompt, "In the beginning");
    CHECK_EQ(r.max_tokens, 60);
    CHECK(r.sp.temperature == 0.0f);
    CHECK_NEAR(r.sp.top_p, 0.9, 1e-6);
    CHECK_EQ(r.sp.top_k, 5);
    CHECK_NEAR(r.sp.min_p, 0.1, 1e-6);
    CHECK(r.seeded && r.sp.seed == 42);
    CHECK_EQ(r.n_stops, 2);
    CHECK_STR_EQ(r.stops[1], "bc");
    CHECK(r.stream && r.include_usage);
    CHECK(r.logprobs && r.top_logprobs == 3 && r.sp.logprobs && r.sp.n_probs == 3);
    CHECK_NEAR(r.sp.presence_penalty, 0.5, 1e-6);
    CHECK_NEAR(r.sp.frequency_penalty, -0.5, 1e-6);
    CHECK_NEAR(r.sp.repeat_penalty, 1.1, 1e-6);
    srv_request_free(&r);

    // defaults: OpenAI's sampling, max_tokens left to the route, a random seed
    r = parse_ok(SRV_ROUTE_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"only one\"]}");
    CHECK_STR_EQ(r.prompt, "only one");
    CHECK_EQ(r.max_tokens, -1);
    CHECK(r.sp.temperature == 1.0f && r.sp.top_p == 1.0f && r.sp.top_k == 0 && r.sp.min_p == 0.0f);
    CHECK(!r.seeded && !r.stream && !r.logprobs && r.n_stops == 0);
    srv_request_free(&r);
    // max_completion_tokens is accepted; a stop string alone
    r = parse_ok(SRV_ROUTE_CHAT,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"max_completion_tokens\":7,\"stop\":\"\\n\",\"logprobs\":true,"
                 "\"top_logprobs\":2}");
    CHECK_EQ(r.max_tokens, 7);
    CHECK_EQ(r.n_stops, 1);
    CHECK_STR_EQ(r.stops[0], "\n");
    CHECK(r.logprobs && r.top_logprobs == 2);
    srv_request_free(&r);

    // chat messages, text parts joined
    r = parse_ok(SRV_ROUTE_CHAT,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
                 "{\"type\":\"text\",\"text\":\"lo \\u00e9\"}]}]}");
    CHECK_EQ(r.n_msgs, 2);
    CHECK_STR_EQ(r.msgs[0].role, "system");
    CHECK_STR_EQ(r.msgs[0].content, "Be brief.");
    CHECK_STR_EQ(r.msgs[1].role, "user");
    CHECK_STR_EQ(r.msgs[1].content, "Hello \xc3\xa9");
    srv_request_free(&r);

    // Workers AI: prompt or messages; its own temperature default
    r = parse_ok(SRV_ROUTE_WORKERS, "{\"prompt\":\"hi\",\"max_tokens\":3}");
    CHECK_STR_EQ(r.prompt, "hi");
    CHECK_NEAR(r.sp.temperature, 0.6, 1e-6);
    srv_request_free(&r);
    r = parse_ok(SRV_ROUTE_WORKERS, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    CHECK_EQ(r.n_msgs, 1);
    CHECK(r.prompt == NULL);
    srv_request_free(&r);
}

static void test_request_invalid(void) {
    const srv_route C = SRV_ROUTE_COMPLETIONS, H = SRV_ROUTE_CHAT, W = SRV_ROUTE_WORKERS;
    // malformed JSON: line, column and position from jansson
    expect_invalid(C, "{\"prompt\": \"x\",\n  \"max_tokens\": }", NULL, "invalid_json",
                   "line 2, column");
    expect_invalid(C, "{\"prompt\": \"x\",\n  \"max_tokens\": }", NULL, "invalid_json", "position");
    expect_invalid(C, "", NULL, "invalid_json", "malformed JSON");
    // invalid UTF-8, a lone surrogate, a NUL escape: all malformed
    expect_invalid(C, "{\"prompt\":\"\xff\xfe\"}", NULL, "invalid_json", "malformed JSON");
    expect_invalid(C, "{\"prompt\":\"\xc0\xaf\"}", NULL, "invalid_json", "malformed JSON");
    expect_invalid(C, "{\"prompt\":\"\\ud800\"}", NULL, "invalid_json", "malformed JSON");
    expect_invalid(C, "{\"prompt\":\"a\\u0000b\"}", NULL, "invalid_json", "malformed JSON");
    expect_invalid(C, "{\"prompt\":\"a\",\"prompt\":\"b\"}", NULL, "invalid_json", "duplicate");
    expect_invalid(C, "[1,2]", NULL, NULL, "must be a JSON object");
    // wrong types, with the parameter named
    expect_invalid(C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature",
                   "invalid_parameter", "'temperature' must be a number, got string");
    expect_invalid(C, "{\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens", NULL,
                   "must be an integer, got number");
    expect_invalid(C, "{\"prompt\":\"x\",\"stream\":1}", "stream", NULL, "must be a boolean");
    expect_invalid(C, "{\"prompt\":\"x\",\"model\":3}", "model", NULL, "'model' must be a string");
    expect_invalid(C, "{\"prompt\":5}", "prompt", NULL, "'prompt' must be a string");
    expect_invalid(C, "{\"prompt\":[\"a\",\"b\"]}", "prompt", NULL, "exactly one string");
    expect_invalid(C, "{\"max_tokens\":5}", "prompt", "missing_required_parameter", "required");
    expect_invalid(C, "{\"prompt\":\"x\",\"seed\":\"1\"}", "seed", NULL, "integer");
    // ranges: negative or huge max_tokens, temperature, top_p, penalties
    expect_invalid(C, "{\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens", NULL, "got -1");
    expect_invalid(C, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", NULL, "got 0");
    expect_invalid(C, "{\"prompt\":\"x\",\"max_tokens\":99999999999}", "max_tokens", NULL,
                   "got 99999999999");
    expect_invalid(C, "{\"prompt\":\"x\",\"max_completion_tokens\":-3}", "max_completion_tokens",
                   NULL, "got -3");
    expect_invalid(C, "{\"prompt\":\"x\",\"temperature\":2.5}", "temperature", NULL, "[0, 2]");
    expect_invalid(C, "{\"prompt\":\"x\",\"temperature\":-1}", "temperature", NULL, "got -1");
    expect_invalid(C, "{\"prompt\":\"x\",\"top_p\":0}", "top_p", NULL, "(0, 1]");
    expect_invalid(C, "{\"prompt\":\"x\",\"top_k\":-2}", "top_k", NULL, "got -2");
    expect_invalid(C, "{\"prompt\":\"x\",\"min_p\":1.5}", "min_p", NULL, "got 1.5");
    expect_invalid(C, "{\"prompt\":\"x\",\"presence_penalty\":3}", "presence_penalty", NULL,
                   "got 3");
    expect_invalid(C, "{\"prompt\":\"x\",\"repetition_penalty\":0}", "repetition_penalty", NULL,
                   "> 0");
    expect_invalid(C, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs", NULL, "got 21");
    // min_tokens (vLLM's): an integer >= 0, at most max_tokens when both are given
    expect_invalid(C, "{\"prompt\":\"x\",\"min_tokens\":-1}", "min_tokens", NULL, "got -1");
    expect_invalid(C, "{\"prompt\":\"x\",\"min_tokens\":1.5}", "min_tokens", NULL, "integer");
    expect_invalid(C, "{\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}", "min_tokens", NULL,
                   "must be <= 'max_tokens' (4), got 5");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":2,"
                      "\"min_tokens\":3}",
                   "min_tokens", NULL, "got 3");
    {
        srv_request m = parse_ok(SRV_ROUTE_COMPLETIONS,
                                 "{\"model\":\"kjv\",\"prompt\":\"x\",\"max_tokens\":9,\"min_tokens\":9}");
        CHECK_EQ(m.sp.min_tokens, 9);
        srv_request_free(&m);
        m = parse_ok(SRV_ROUTE_COMPLETIONS, "{\"model\":\"kjv\",\"prompt\":\"x\",\"min_tokens\":500}");
        CHECK_EQ(m.sp.min_tokens, 500); // no max_tokens given: max_tokens ends it
        srv_request_free(&m);
    }
    // n, stop
    // issue 12: n, best_of, echo, logit_bias
    expect_invalid(C, "{\"prompt\":\"x\",\"n\":17}", "n", NULL, "[1, 16], got 17");
    expect_invalid(C, "{\"prompt\":\"x\",\"n\":0}", "n", NULL, "got 0");
    expect_invalid(C, "{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", "best_of", NULL,
                   "must be >= 'n' (3), got 2");
    expect_invalid(C, "{\"prompt\":\"x\",\"best_of\":2,\"stream\":true}", "best_of", NULL,
                   "cannot be streamed");
    expect_invalid(C, "{\"prompt\":\"x\",\"echo\":1}", "echo", NULL, "boolean");
    expect_invalid(C, "{\"prompt\":\"x\",\"logit_bias\":[1]}", "logit_bias", NULL, "object");
    expect_invalid(C, "{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}", "logit_bias", NULL,
                   "token ids");
    expect_invalid(C, "{\"prompt\":\"x\",\"logit_bias\":{\"99999999999\":1}}", "logit_bias", NULL,
                   "token ids");
    expect_invalid(C, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"a\"}}", "logit_bias", NULL,
                   "must be a number");
    expect_invalid(C, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":-100.5}}", "logit_bias", NULL,
                   "[-100, 100], got -100.5");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"echo\":true}",
                   "echo", "unsupported_parameter", "echo");
    {
        srv_request r;
        srv_error err;
        const char *b = "{\"model\":\"m\",\"prompt\":\"x\",\"n\":2,\"best_of\":5,\"echo\":true,"
                        "\"max_tokens\":0,\"logit_bias\":{\"7\":-100,\"12\":2.5}}";
        CHECK(srv_request_parse(C, b, strlen(b), &r, &err));
        CHECK_EQ(r.n, 2);
        CHECK_EQ(r.best_of, 5);
        CHECK(r.echo);
        CHECK_EQ(r.max_tokens, 0);
        CHECK(r.sp.logprobs); // best_of ranks by logprobs
        CHECK_EQ(r.n_bias, 2);
        CHECK_EQ(r.bias[0].token + r.bias[1].token, 19);
        srv_request_free(&r);
        char big[24 * 1100] = "{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{";
        for (int i = 0; i < 1025; i++)
            snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"%d\":1", i ? "," : "", i);
        strcat(big, "}}");
        CHECK(!srv_request_parse(C, big, strlen(big), &r, &err));
        CHECK_STR_HAS(err.msg, "at most 1024 entries");
    }
    expect_invalid(C, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", NULL,
                   "at most 4");
    expect_invalid(C, "{\"prompt\":\"x\",\"stop\":\"\"}", "stop", NULL, "empty");
    expect_invalid(C, "{\"prompt\":\"x\",\"stop\":[\"a\",1]}", "stop", NULL,
                   "'stop[1]' must be a string");
    expect_invalid(C, "{\"prompt\":\"x\",\"stream_options\":3}", "stream_options", NULL, "object");
    // chat: messages
    expect_invalid(H, "{\"max_tokens\":2}", "messages", "missing_required_parameter", "required");
    expect_invalid(H, "{\"messages\":[]}", "messages", NULL, "must not be empty");
    expect_invalid(H, "{\"messages\":{}}", "messages", NULL, "must be an array");
    expect_invalid(H, "{\"messages\":[\"hi\"]}", "messages[0]", NULL, "must be an object");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":1}]}",
                   "messages[1].role", NULL, "must be a string");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages[0].content",
                   NULL, "string or an array");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                   "messages[0].content", NULL, "only text parts");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}",
                   "top_logprobs", NULL, "requires 'logprobs'");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}",
                   "logprobs", NULL, "boolean");
    // issue 8: a model is required (OpenAI), except on Workers AI (in the URL)
    expect_invalid(C, "{\"prompt\":\"x\"}", "model", "missing_required_parameter",
                   "you must provide a model parameter");
    expect_invalid(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"model\":null}",
                   "model", "missing_required_parameter", "model");
    // issue 8: every field kvseal does not implement is refused by name, on
    // every route, rather than ignored
    static const char *const unsupported[] = {
        "suffix", "tool_choice", "functions",     "raw", "json_schema", "parallel_tool_calls",
        "lora_request", "tenant",  "unknown_field",
    };
    // LoRA: "adapter" (every route) and Workers AI's "lora" name an adapter by a string
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"adapter\":1}", "adapter",
                   "invalid_parameter", "must be a non-empty string");
    expect_invalid(W, "{\"prompt\":\"x\",\"lora\":\"\"}", "lora", "invalid_parameter",
                   "an empty string");
    expect_invalid(W, "{\"prompt\":\"x\",\"lora\":\"a\",\"adapter\":\"a\"}", "lora",
                   "invalid_parameter", "not both");
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"lora\":\"a\"}", "lora",
                   "unsupported_parameter", "lora");
    // issue 12: chat takes tools and chat_template_kwargs (tests/e2e/
    // test_chat_template.sh); the other routes still refuse them by name
    static const char *const chat_only[] = {"tools", "chat_template_kwargs"};
    for (size_t i = 0; i < sizeof chat_only / sizeof *chat_only; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",\"%s\":1}", chat_only[i]);
        expect_invalid(C, body, chat_only[i], "unsupported_parameter", chat_only[i]);
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":true}", chat_only[i]);
        expect_invalid(W, body, chat_only[i], "unsupported_parameter", "Unsupported parameter");
    }
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",\"%s\":1}", unsupported[i]);
        expect_invalid(C, body, unsupported[i], "unsupported_parameter", unsupported[i]);
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":true}", unsupported[i]);
        expect_invalid(W, body, unsupported[i], "unsupported_parameter", "Unsupported parameter");
        if (strstr(unsupported[i], "tool")) continue; // chat implements these (toolcall.c)
        snprintf(
            body, sizeof body,
            "{\"model\":\"m\",\"%s\":null,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
            unsupported[i]);
        expect_invalid(H, body, unsupported[i], "unsupported_parameter", unsupported[i]);
    }
    // issue 12: structured output on chat and completions (compiled at parse
    // time; bad schemas and grammars name their parameter), not on Workers AI
    for (int k = 0; k < 2; k++) {
        const char *f = k ? "response_format" : "grammar";
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":true}", f);
        expect_invalid(W, body, f, "unsupported_parameter", "Unsupported parameter");
    }
    {
        srv_request r =
            parse_ok(C, "{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= [a-z]+\"}");
        CHECK(r.grammar);
        CHECK_STR_EQ(r.grammar_param, "grammar");
        srv_request_free(&r);
        r = parse_ok(H, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                        "\"response_format\":{\"type\":\"json_object\"}}");
        CHECK(r.grammar);
        CHECK_STR_EQ(r.grammar_param, "response_format");
        srv_request_free(&r);
        r = parse_ok(C, "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"},"
                        "\"grammar\":null}");
        CHECK(!r.grammar);
        srv_request_free(&r);
        r = parse_ok(
            H, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
               "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
               "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
               "{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}");
        CHECK(r.grammar);
        srv_request_free(&r);
    }
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":1}", "grammar", NULL,
                   "must be a string");
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= (\"}", "grammar",
                   NULL, "line 1, column 11");
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":1}", "response_format",
                   NULL, "must be an object");
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"yaml\"}}",
                   "response_format.type", NULL, "yaml");
    expect_invalid(
        C,
        "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\","
        "\"schema\":{}}}",
        "response_format.schema", "unsupported_parameter", "not supported");
    expect_invalid(
        C,
        "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}}",
        "response_format.json_schema.schema", "unsupported_parameter", "a lookahead at offset 0");
    expect_invalid(
        C,
        "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"schema\":{}}}}",
        "response_format.json_schema.name", "missing_required_parameter", "name");
    expect_invalid(C,
                   "{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\","
                   "\"response_format\":{\"type\":\"json_object\"}}",
                   "grammar", NULL, "cannot be combined");
    // route-specific: what one route implements another refuses
    expect_invalid(C, "{\"model\":\"m\",\"prompt\":\"x\",\"top_logprobs\":1}", "top_logprobs",
                   "unsupported_parameter", "top_logprobs");
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"prompt\":\"x\"}",
                   "prompt", "unsupported_parameter", "prompt");
    expect_invalid(W, "{\"model\":\"m\",\"prompt\":\"x\"}", "model", "unsupported_parameter",
                   "named in the URL");
    expect_invalid(W, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "unsupported_parameter",
                   "logprobs");
    expect_invalid(C,
                   "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true,"
                   "\"chunk_size\":4}}",
                   "stream_options.chunk_size", "unsupported_parameter", "chunk_size");
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\","
                   "\"audio\":\"bob\"}]}",
                   "messages[0].audio", "unsupported_parameter", "messages[0].audio");
    // issue 12: what a chat template gets is validated, naming the param
    expect_invalid(H, "{\"model\":\"m\",\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}",
                   "messages[0].role", NULL, "system, developer, user, assistant or tool");
    expect_invalid(H, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
                   "messages[0].content", NULL, "string or an array of text parts");
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,"
                   "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                   "\"arguments\":\"{x\"}}]}]}",
                   "messages[0].tool_calls[0].function.arguments", NULL, "must be a JSON string");
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"tools\":[{\"type\":\"function\"}]}",
                   "tools[0].function", NULL, "must be an object");
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"chat_template_kwargs\":{\"tools\":1}}",
                   "chat_template_kwargs", NULL, "cannot set 'tools'");
    // issue 38: only the documented keys: never a template global (bos_token
    // would forge the turn's start, raise_exception/range/namespace are
    // the engine's functions), nor anything else
    static const char *const globals[] = {"bos_token", "eos_token", "raise_exception", "range",
                                          "namespace", "strftime_now", "loop", "foo"};
    for (size_t i = 0; i < sizeof globals / sizeof *globals; i++) {
        char body[256], want[64];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"chat_template_kwargs\":{\"enable_thinking\":false,\"%s\":\"x\"}}",
                 globals[i]);
        snprintf(want, sizeof want, "cannot set '%s'", globals[i]);
        expect_invalid(H, body, "chat_template_kwargs", NULL, want);
    }
    expect_invalid(H,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                   "\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}",
                   "chat_template_kwargs", NULL, "'enable_thinking' must be a boolean");
    {
        srv_request r = parse_ok(
            H, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
               "\"chat_template_kwargs\":{\"enable_thinking\":true,\"thinking\":false,"
               "\"reasoning_effort\":\"low\",\"tools_in_user_message\":false,"
               "\"date_string\":\"26 Jul 2024\",\"builtin_tools\":[\"brave_search\"],"
               "\"documents\":[{\"title\":\"t\",\"text\":\"x\"}]}}");
        CHECK_EQ(json_object_size(r.tmpl_kwargs), 7);
        srv_request_free(&r);
    }
    // workers: exactly one of prompt / messages
    expect_invalid(W, "{}", NULL, NULL, "exactly one of");
    expect_invalid(W, "{\"prompt\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}",
                   "prompt", NULL, "exactly one of");
}

// ----------------------------------------------------------------------------
// Error shapes and SSE

/* Issue 8: the byte bound on a prompt's tokens, checked before tokenizing. */
static void test_prompt_bound(void) {
    CHECK_EQ(srv_prompt_min_tokens(0, 14), 0);
    CHECK_EQ(srv_prompt_min_tokens(1, 14), 1);
    CHECK_EQ(srv_prompt_min_tokens(14, 14), 1);
    CHECK_EQ(srv_prompt_min_tokens(15, 14), 2);
    CHECK_EQ(srv_prompt_min_tokens(1000000, 0), 0); // no bound known
    srv_error e;
    memset(&e, 0, sizeof e);
    // 511 prompt tokens of 14 bytes at most leave one for the completion:
    // 7154 bytes may fit (then max_tokens is the engine's to judge), 7155 cannot
    CHECK(srv_prompt_fits(512, 7154, 14, 16, SRV_ROUTE_COMPLETIONS, &e));
    CHECK(!srv_prompt_fits(512, 7155, 14, 16, SRV_ROUTE_COMPLETIONS, &e));
    CHECK_EQ(e.status, 400);
    CHECK_STR_EQ(e.code, "context_length_exceeded");
    CHECK_STR_EQ(e.param, "prompt");
    CHECK_EQ(e.reason, ADMIT_CONTEXT_LENGTH);
    CHECK_STR_HAS(e.msg, "maximum context length is 512 tokens");
    CHECK_STR_HAS(e.msg, "at least 512 in the prompt of 7155 bytes");
    CHECK(srv_prompt_fits(512, 511 * 14, 14, -1, SRV_ROUTE_CHAT, &e));
    CHECK(!srv_prompt_fits(512, 511 * 14 + 1, 14, -1, SRV_ROUTE_CHAT, &e));
    CHECK_STR_EQ(e.param, "messages");
    CHECK(srv_prompt_fits(512, 100000000, 0, 16, SRV_ROUTE_WORKERS, &e)); // no bound: tokenize
}

/* Issue 8: request framing (RFC 9112) and raw paths. */
static void check_framing(const char *const *hdrs, int status, const char *code) {
    srv_framing f = {0};
    for (int i = 0; hdrs[i]; i += 2)
        srv_framing_add(&f, hdrs[i], hdrs[i + 1]);
    srv_error e;
    memset(&e, 0, sizeof e);
    bool ok = srv_framing_check(&f, &e);
    CHECK_EQ(ok, status == 0);
    if (!ok) {
        CHECK_EQ(e.status, status);
        CHECK_STR_EQ(e.code, code);
        CHECK(e.reason != ADMIT_OK);
        CHECK_EQ(admit_reason_info(e.reason)->http_status, status);
    }
}

/* A chat body of n_parts text parts of part_len bytes each ("a...a"),
 * malloc'd. */
static char *many_parts(int n_parts, size_t part_len) {
    size_t cap = 128 + (size_t)n_parts * (part_len + 32);
    char *b = malloc(cap), *p = b;
    CHECK(b != NULL);
    p += sprintf(p, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i < n_parts; i++) {
        p += sprintf(p, "%s{\"type\":\"text\",\"text\":\"", i ? "," : "");
        memset(p, 'a', part_len);
        p += part_len;
        p += sprintf(p, "\"}");
    }
    sprintf(p, "]}]}");
    return b;
}

/* Issue 38: many content parts are joined in linear time and bounded. */
static void test_content_parts(void) {
    srv_request r;
    srv_error e;
    // the most parts allowed, 1 MiB of text: joined (by "\n") in linear time;
    // joining part by part re-copied the whole text per part (~4 GB here)
    char *b = many_parts(SRV_MAX_CONTENT_PARTS, 256);
    uint64_t t0 = ks_now_ns();
    CHECK(srv_request_parse(SRV_ROUTE_CHAT, b, strlen(b), &r, &e));
    double ms = (double)(ks_now_ns() - t0) * 1e-6;
    const char *joined = json_string_value(
        json_object_get(json_array_get(r.tmpl_msgs, 0), "content"));
    CHECK(joined != NULL);
    CHECK_EQ(strlen(joined), (size_t)SRV_MAX_CONTENT_PARTS * 257 - 1);
    CHECK(joined && joined[256] == '\n' && joined[257] == 'a');
    srv_request_free(&r);
    free(b);
    printf("content parts: %d parts of 256 bytes parsed and joined in %.1f ms\n",
           SRV_MAX_CONTENT_PARTS, ms);
    CHECK(ms < 2000); // linear: tens of ms (x10 under sanitizers); quadratic: ~25 s
    // one more part is a clear 400, on every message together
    b = many_parts(SRV_MAX_CONTENT_PARTS + 1, 1);
    memset(&e, 0, sizeof e);
    CHECK(!srv_request_parse(SRV_ROUTE_CHAT, b, strlen(b), &r, &e));
    CHECK_EQ(e.status, 400);
    CHECK_STR_EQ(e.param, "messages[0].content");
    CHECK_STR_HAS(e.msg, "more than 4096 content parts");
    free(b);
}

static void test_framing(void) {
    const char *plain[] = {"Host", "x", "Content-Length", "12", "Authorization", "Bearer k", NULL};
    check_framing(plain, 0, NULL);
    const char *same[] = {"Content-Length", "12", "content-length", " 12 ", NULL};
    check_framing(same, 0, NULL);
    const char *differ[] = {"Content-Length", "12", "Content-Length", "5", NULL};
    check_framing(differ, 400, "invalid_framing");
    const char *cl_te[] = {"Content-Length", "12", "Transfer-Encoding", "chunked", NULL};
    check_framing(cl_te, 400, "invalid_framing");
    const char *chunked[] = {"transfer-encoding", "Chunked", NULL};
    check_framing(chunked, 0, NULL);
    const char *te_twice[] = {"Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked", NULL};
    check_framing(te_twice, 400, "invalid_framing");
    const char *te_gzip[] = {"Transfer-Encoding", "gzip, chunked", NULL};
    check_framing(te_gzip, 501, "unsupported_transfer_encoding");
    const char *ce[] = {"Content-Length", "3", "Content-Encoding", "br", NULL};
    check_framing(ce, 415, "unsupported_content_encoding");
    const char *ce_id[] = {"Content-Length", "3", "Content-Encoding", "identity", NULL};
    check_framing(ce_id, 0, NULL);
    const char *auth2[] = {"Authorization", "Bearer a", "authorization", "Bearer a", NULL};
    check_framing(auth2, 400, "duplicate_header");
    // Anthropic's header too: which of two keys is meant is ambiguous
    const char *xkey2[] = {"x-api-key", "sk-a", "X-Api-Key", "sk-b", NULL};
    check_framing(xkey2, 400, "duplicate_header");
    const char *xkey_auth[] = {"x-api-key", "sk-a", "Authorization", "Bearer sk-a", NULL};
    check_framing(xkey_auth, 0, NULL);

    srv_error e;
    CHECK(srv_path_check("/v1/completions", &e));
    CHECK(srv_path_check("/v1/completions?x=%2F&y=%00", &e)); // the query is not the path
    CHECK(srv_path_check("/accounts/a%20b/ai/run/@cf/x", &e));
    CHECK(srv_path_check("/v1/completions%", &e));
    CHECK(!srv_path_check("/v1%2Fcompletions", &e));
    CHECK_EQ(e.status, 400);
    CHECK_STR_EQ(e.code, "invalid_path");
    CHECK(!srv_path_check("/accounts/a%2fb/ai/run/kjv", &e));
    CHECK(!srv_path_check("/v1/completions%00", &e));
    // a model id may hold an encoded slash (openai 6.x sends "org/model" so) ...
    CHECK(srv_path_check("/v1/models/%40cf%2Fkvseal%2Fkjv-mini", &e));
    CHECK(srv_path_check("/v1/models/org%2fmodel?x=1", &e));
    CHECK(srv_path_check("/accounts/a/ai/run/%40cf%2Fkvseal%2Fkjv-mini", &e));
    CHECK(srv_path_check("/client/v4/accounts/a/ai/run/org%2Fm", &e));
    CHECK(srv_path_check("/admin/models/org%2Fm/offline", &e));
    // ... but nowhere a decoded slash would pick another route
    CHECK(!srv_path_check("/v1%2Fmodels/kjv", &e));
    CHECK(!srv_path_check("/v1/models%2Fkjv", &e));
    CHECK(!srv_path_check("/accounts/a%2Fai/run/kjv", &e));
    CHECK(!srv_path_check("/accounts/a/ai%2Frun/kjv", &e));
    CHECK(!srv_path_check("/admin/models/m%2Foffline", &e));
    CHECK(!srv_path_check("/admin/models%2Fm/offline", &e));
    CHECK(!srv_path_check("/v1/models/a%00b", &e));
}

static void test_error_shapes(void) {
    srv_error e;
    srv_refuse(&e, ADMIT_CONTEXT_LENGTH, "messages", "limit is %d tokens", 512);
    CHECK_EQ(e.status, 400);
    char *s = srv_error_json(SRV_ROUTE_CHAT, &e);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    CHECK(j);
    json_t *err = json_object_get(j, "error");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "message")), "limit is 512 tokens");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "param")), "messages");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "code")), "context_length_exceeded");
    CHECK_EQ(json_object_size(j), 1);
    json_decref(j);
    free(s);
    // param and code null when absent
    srv_fail(&e, 499, NULL, "gone");
    s = srv_error_json(SRV_ROUTE_COMPLETIONS, &e);
    CHECK_STR_EQ(s, "{\"error\":{\"message\":\"gone\",\"type\":\"invalid_request_error\","
                    "\"param\":null,\"code\":null}}");
    CHECK_EQ(e.reason, ADMIT_OK); // a failure, not a refusal: not counted as one
    free(s);
    // Workers AI shape: its documented code where there is one (offline: 3040,
    // out of capacity), else the status (a failure's)
    srv_refuse(&e, ADMIT_OFFLINE, NULL, "offline");
    s = srv_error_json(SRV_ROUTE_WORKERS, &e);
    CHECK_STR_EQ(s, "{\"result\":null,\"success\":false,\"errors\":[{\"code\":3040,"
                    "\"message\":\"offline\"}],\"messages\":[]}");
    free(s);
    srv_fail(&e, 502, "upstream_error", "lost");
    s = srv_error_json(SRV_ROUTE_WORKERS, &e);
    CHECK_STR_HAS(s, "\"errors\":[{\"code\":502,");
    free(s);
    srv_refuse(&e, ADMIT_TOO_LARGE, NULL, NULL);
    CHECK_EQ(e.status, 413);
    s = srv_error_json(SRV_ROUTE_WORKERS, &e);
    CHECK_STR_EQ(s, "{\"result\":null,\"success\":false,\"errors\":[{\"code\":3006,"
                    "\"message\":\"the request is too large\"}],\"messages\":[]}");
    free(s);
    // Client bytes in a message (found by fuzz_json): a model name from the
    // URL need not be UTF-8, and a long one is cut, maybe inside a character.
    // Both used to make srv_error_json fail, so the client got 500 "out of
    // memory" instead of 404.
    srv_refuse(&e, ADMIT_MODEL_NOT_FOUND, "model", "The model '%s' does not exist",
               "a\xff\xc3(b\xed\xa0\x80");
    CHECK_STR_EQ(e.msg, "The model 'a?\?(b?\?\?' does not exist"); /* \?: no trigraphs */
    s = srv_error_json(SRV_ROUTE_WORKERS, &e);
    CHECK(s != NULL);
    free(s);
    char name[600];
    name[0] = 'x';
    for (int i = 1; i + 2 < (int)sizeof name; i += 2) name[i] = '\xc3', name[i + 1] = '\xa9';
    name[sizeof name - 1] = '\0';
    srv_refuse(&e, ADMIT_MODEL_NOT_FOUND, "model", "The model '%s' does not exist", name);
    CHECK_EQ(strlen(e.msg), sizeof e.msg - 1);
    CHECK_EQ(e.msg[sizeof e.msg - 2], '?'); /* 0xc3 of the split 'é' */
    s = srv_error_json(SRV_ROUTE_CHAT, &e);
    CHECK(s != NULL);
    free(s);
    CHECK_STR_EQ(admit_reason_info(ADMIT_TENANT_RATE)->name, "tenant_rate");
    CHECK_STR_EQ(srv_finish_name(ENGINE_FINISH_LENGTH), "length");
    CHECK(srv_finish_name(ENGINE_FINISH_ABORT) == NULL);
}

static void test_sse(void) {
    srv_buf b = {0};
    json_t *j = json_pack("{s:s}", "response", "two\nlines\r\n and \"quotes\"");
    CHECK(srv_sse_json(&b, j));
    json_decref(j);
    // one data: line per event, a blank line after it, newlines escaped
    CHECK_STR_EQ(b.p, "data: {\"response\":\"two\\nlines\\r\\n and \\\"quotes\\\"\"}\n\n");
    CHECK(srv_sse_done(&b));
    CHECK_STR_HAS(b.p, "\n\ndata: [DONE]\n\n");
    CHECK_EQ(b.len, strlen(b.p));
    CHECK_EQ(b.p[b.len - 1], '\n');
    srv_buf_free(&b);
    j = srv_usage_json(&(engine_event){.n_prompt = 5, .n_gen = 60, .n_cached = 3});
    char *s = json_dumps(j, JSON_COMPACT);
    CHECK_STR_EQ(s, "{\"prompt_tokens\":5,\"completion_tokens\":60,\"total_tokens\":65,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":3}}");
    free(s);
    json_decref(j);
    // speculative decoding: drafts kept, and computed but not kept (OpenAI's names)
    j = srv_usage_json(
        &(engine_event){.n_prompt = 5, .n_gen = 60, .n_drafted = 40, .n_accepted = 31});
    s = json_dumps(j, JSON_COMPACT);
    CHECK_STR_HAS(s, "\"completion_tokens_details\":{\"accepted_prediction_tokens\":31,"
                     "\"rejected_prediction_tokens\":9}");
    free(s);
    json_decref(j);
    char id[48];
    srv_make_id("chatcmpl-", id, sizeof id);
    CHECK_EQ(strlen(id), 9 + 24);
    CHECK(!strncmp(id, "chatcmpl-", 9));
    char id2[48];
    srv_make_id("chatcmpl-", id2, sizeof id2);
    CHECK(strcmp(id, id2) != 0);
}

// ----------------------------------------------------------------------------
// Tenants

static const char *TENANTS =
    "{\"tenants\":[{\"name\":\"acme\",\"keys\":[\"sk-acme-1\",\"sk-acme-2\"],"
    "\"max_concurrent\":2,\"tokens_per_minute\":600},"
    "{\"name\":\"globex\",\"keys\":[\"sk-globex\"]}],\"admin_key\":\"adm-secret-0123456789\","
    "\"log_content\":true}";

static void expect_tenants_error(const char *text, const char *needle) {
    srv_tenants *ts = (srv_tenants *)1;
    ks_errbuf eb = {0};
    CHECK_EQ(srv_tenants_parse(text, strlen(text), &ts, &eb), KS_ERR_FORMAT);
    CHECK(ts == NULL);
    CHECK_STR_HAS(eb.msg, needle);
}

static void test_tenants(void) {
    srv_tenants *ts = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(srv_tenants_parse(TENANTS, strlen(TENANTS), &ts, &eb), KS_OK);
    CHECK_EQ(ts->n, 2);
    CHECK(!ts->anonymous && ts->has_admin && ts->log_content);
    CHECK_STR_EQ(ts->t[0].name, "acme");
    CHECK_EQ(ts->t[0].max_concurrent, 2);
    CHECK_EQ(ts->t[0].tokens_per_minute, 600);
    CHECK_EQ(ts->t[1].max_concurrent, 0); // unlimited
    // keys map to their tenant; every key of every tenant is found
    CHECK_EQ(srv_tenants_auth(ts, "sk-acme-1", 9), 0);
    CHECK_EQ(srv_tenants_auth(ts, "sk-acme-2", 9), 0);
    CHECK_EQ(srv_tenants_auth(ts, "sk-globex", 9), 1);
    CHECK_EQ(srv_tenants_auth(ts, "sk-acme-3", 9), -1);
    CHECK_EQ(srv_tenants_auth(ts, "sk-acme-1x", 10), -1);
    CHECK_EQ(srv_tenants_auth(ts, "sk-acme-", 8), -1);
    CHECK_EQ(srv_tenants_auth(ts, "", 0), -1);
    CHECK(srv_tenants_admin_ok(ts, "adm-secret-0123456789", 21));
    CHECK(!srv_tenants_admin_ok(ts, "adm-secret", 10));
    CHECK(!srv_tenants_admin_ok(ts, "sk-acme-1", 9));
    // only hashes are kept: the stored value is SHA-256(key), not the key
    uint8_t h[32];
    crypto_hash_sha256(h, (const unsigned char *)"sk-globex", 9);
    CHECK_MEM_EQ(ts->t[1].key_hash[0], h, 32);
    CHECK(memcmp(ts->t[1].key_hash[0], "sk-globex", 9) != 0);
    // --admin-key overrides the file's
    srv_tenants_set_admin(ts, "other-admin-key-16");
    CHECK(!srv_tenants_admin_ok(ts, "adm-secret-0123456789", 21));
    CHECK(srv_tenants_admin_ok(ts, "other-admin-key-16", 18));
    // /metrics (issue 38): the admin key reads it; no tenant key does; a
    // metrics key too once set, and it is no admin key
    CHECK(srv_tenants_metrics_ok(ts, "other-admin-key-16", 18));
    CHECK(!srv_tenants_metrics_ok(ts, "sk-acme-1", 9));
    CHECK(!srv_tenants_metrics_ok(ts, "mk-scrape", 9));
    srv_tenants_set_metrics(ts, "mk-scrape");
    CHECK(srv_tenants_metrics_ok(ts, "mk-scrape", 9));
    CHECK(srv_tenants_metrics_ok(ts, "other-admin-key-16", 18));
    CHECK(!srv_tenants_admin_ok(ts, "mk-scrape", 9));
    CHECK(!srv_tenants_metrics_ok(ts, "sk-globex", 9));

    // concurrency: two admitted, the third refused until one ends
    char msg[256];
    uint64_t t0 = 1000000000ull;
    CHECK_EQ(srv_tenants_admit(ts, 0, 100, t0, msg, sizeof msg), ADMIT_OK);
    CHECK_EQ(srv_tenants_admit(ts, 0, 100, t0, msg, sizeof msg), ADMIT_OK);
    CHECK_EQ(srv_tenants_admit(ts, 0, 100, t0, msg, sizeof msg), ADMIT_TENANT_CONCURRENCY);
    CHECK_STR_HAS(msg, "limit 2");
    // the other tenant is unaffected (no limits)
    for (int i = 0; i < 10; i++)
        CHECK_EQ(srv_tenants_admit(ts, 1, 1000000, t0, msg, sizeof msg), ADMIT_OK);
    for (int i = 0; i < 10; i++)
        srv_tenants_release(ts, 1, 0);
    srv_tenants_release(ts, 0, 0);   // used everything: 400 left
    srv_tenants_release(ts, 0, 100); // refunded: 500 left
    CHECK_NEAR(ts->t[0].bucket, 500, 1e-9);
    // token bucket: 500 available, 501 refused, larger than the limit says so
    CHECK_EQ(srv_tenants_admit(ts, 0, 501, t0, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_STR_HAS(msg, "600 tokens per minute");
    CHECK_EQ(srv_tenants_admit(ts, 0, 601, t0, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_STR_HAS(msg, "lower max_tokens");
    CHECK_EQ(srv_tenants_admit(ts, 0, 500, t0, msg, sizeof msg), ADMIT_OK);
    CHECK_EQ(srv_tenants_admit(ts, 0, 1, t0, msg, sizeof msg), ADMIT_TENANT_RATE);
    // refill: 600/min = 10 per second; capped at the limit
    CHECK_EQ(srv_tenants_admit(ts, 0, 10, t0 + 1000000000ull, msg, sizeof msg), ADMIT_OK);
    srv_tenants_release(ts, 0, 0);
    srv_tenants_release(ts, 0, 0);
    CHECK_EQ(srv_tenants_admit(ts, 0, 600, t0 + 3600000000000ull, msg, sizeof msg), ADMIT_OK);
    CHECK_NEAR(ts->t[0].bucket, 0, 1e-6);
    srv_tenants_release(ts, 0, 0);
    CHECK_EQ(ts->t[0].running, 0);

    // issue 38: each of n choices takes a slot of max_concurrent (2 here):
    // n=16 can never run, n=2 takes both, and n=1 then waits for them
    uint64_t tn = t0 + 5400000000000ull; // bucket full again: 600
    CHECK_EQ(srv_tenants_admit_n(ts, 0, 16, 32, tn, msg, sizeof msg), ADMIT_TENANT_CONCURRENCY);
    CHECK_STR_HAS(msg, "lower n");
    CHECK_EQ(ts->t[0].running, 0);
    CHECK_EQ(srv_tenants_admit_n(ts, 0, 2, 32, tn, msg, sizeof msg), ADMIT_OK);
    CHECK_EQ(ts->t[0].running, 2);
    CHECK_EQ(srv_tenants_admit(ts, 0, 1, tn, msg, sizeof msg), ADMIT_TENANT_CONCURRENCY);
    srv_tenants_release_n(ts, 0, 2, 32);
    CHECK_EQ(srv_tenants_admit_n(ts, 0, 2, 32, tn, msg, sizeof msg), ADMIT_OK);
    srv_tenants_refuse_n(ts, 0, 2, 32, 0);
    CHECK_EQ(ts->t[0].running, 0);
    CHECK_NEAR(ts->t[0].bucket, 600, 1e-6);

    // issue 8: admitted on a lower bound, grown to the exact count once
    // tokenized; refused work is charged, even past the bucket (a debt)
    uint64_t t1 = t0 + 7200000000000ull; // bucket full again: 600
    CHECK_EQ(srv_tenants_admit(ts, 0, 100, t1, msg, sizeof msg), ADMIT_OK);
    CHECK_EQ(srv_tenants_grow(ts, 0, 100, 300, t1, msg, sizeof msg), ADMIT_OK);
    CHECK_NEAR(ts->t[0].bucket, 300, 1e-6);
    CHECK_EQ(srv_tenants_grow(ts, 0, 300, 700, t1, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_STR_HAS(msg, "lower max_tokens");
    CHECK_EQ(srv_tenants_grow(ts, 0, 300, 601, t1, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_EQ(srv_tenants_admit(ts, 0, 200, t1, msg, sizeof msg), ADMIT_OK); // 100 left
    CHECK_EQ(srv_tenants_grow(ts, 0, 300, 500, t1, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_STR_HAS(msg, "request needs 500, 400 available now");
    CHECK_NEAR(ts->t[0].bucket, 100, 1e-6); // a refused grow takes nothing
    srv_tenants_release(ts, 0, 200);
    CHECK_NEAR(ts->t[0].bucket, 300, 1e-6);
    srv_tenants_refuse(ts, 0, 300, 250); // 250 tokens of work: 50 back
    CHECK_NEAR(ts->t[0].bucket, 350, 1e-6);
    CHECK_EQ(ts->t[0].running, 0);
    CHECK_EQ(srv_tenants_admit(ts, 0, 300, t1, msg, sizeof msg), ADMIT_OK);
    srv_tenants_refuse(ts, 0, 300, 513); // charged more than it reserved
    CHECK_NEAR(ts->t[0].bucket, -163, 1e-6);
    CHECK_EQ(srv_tenants_admit(ts, 0, 1, t1, msg, sizeof msg), ADMIT_TENANT_RATE);
    // the debt is paid by refilling (10 per second): 17 s later 7 are there
    CHECK_EQ(srv_tenants_admit(ts, 0, 7, t1 + 17000000000ull, msg, sizeof msg), ADMIT_OK);
    srv_tenants_release(ts, 0, 0);
    CHECK_EQ(ts->t[0].running, 0);
    srv_tenants_free(ts);
    // a tenant in debt (charged for refused work) gets no zero-token request
    // either (tokenize), with a message that makes sense
    {
        const char *f = "{\"tenants\":[{\"name\":\"d\",\"keys\":[\"k\"],\"tokens_per_minute\":100}]}";
        ks_errbuf deb = {0};
        CHECK_EQ(srv_tenants_parse(f, strlen(f), &ts, &deb), KS_OK);
        CHECK_EQ(srv_tenants_admit(ts, 0, 0, t0, msg, sizeof msg), ADMIT_OK);
        srv_tenants_refuse(ts, 0, 0, 150); // charged 150: 50 in debt
        CHECK_EQ(srv_tenants_admit(ts, 0, 0, t0, msg, sizeof msg), ADMIT_TENANT_RATE);
        CHECK_STR_HAS(msg, "limit of 100 tokens per minute (-50 available now)");
        srv_tenants_free(ts);
    }

    // anonymous: tenant 0 "default", any key
    ts = srv_tenants_anonymous();
    CHECK(ts && ts->anonymous);
    CHECK_STR_EQ(ts->t[0].name, "default");
    CHECK_EQ(srv_tenants_auth(ts, "whatever", 8), 0);
    CHECK(!srv_tenants_admin_ok(ts, "", 0));
    CHECK(!srv_tenants_metrics_ok(ts, "", 0)); // none set (the route is open without tenants)
    srv_tenants_free(ts);
    srv_tenants_free(NULL);
    // the file's metrics_key
    {
        const char *f = "{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"]}],\"metrics_key\":\"mk-1-0123456789ab\"}";
        ks_errbuf meb = {0};
        CHECK_EQ(srv_tenants_parse(f, strlen(f), &ts, &meb), KS_OK);
        CHECK(srv_tenants_metrics_ok(ts, "mk-1-0123456789ab", 17));
        CHECK(!srv_tenants_metrics_ok(ts, "k", 1));
        CHECK(!srv_tenants_admin_ok(ts, "mk-1-0123456789ab", 17));
        srv_tenants_free(ts);
    }
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"]}],\"metrics_key\":\"\"}",
                         "metrics_key");
    // a metrics key a guesser could reach is refused, as an admin key is
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"]}],\"metrics_key\":\"mk-1\"}",
                         "\"metrics_key\" has 4 bytes; at least 16");

    // malformed files: the message says where, never a key
    expect_tenants_error("{\"tenants\":[", "line 1");
    expect_tenants_error("{\"tenants\":[]}", "at least one tenant");
    expect_tenants_error("{\"tenants\":[{\"keys\":[\"k\"]}]}", "tenants[0]: needs a \"name\"");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\"}]}", "non-empty \"keys\"");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"\"]}]}", "keys[0]");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k1\"]},"
                         "{\"name\":\"a\",\"keys\":[\"k2\"]}]}",
                         "duplicate name");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"secret-k\"]},"
                         "{\"name\":\"b\",\"keys\":[\"secret-k\"]}]}",
                         "same key");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"],\"max_concurrent\":-1}]}",
                         "max_concurrent");
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"]}],\"admin_key\":5}",
                         "admin_key");
    // an admin key short enough to guess is refused, as --admin-key is
    expect_tenants_error("{\"tenants\":[{\"name\":\"a\",\"keys\":[\"k\"]}],"
                         "\"admin_key\":\"adm-short\"}",
                         "\"admin_key\" has 9 bytes; at least 16 are needed");
    ks_errbuf eb2 = {0};
    const char *t = "{\"tenants\":[{\"name\":\"a\",\"keys\":[\"secret-k\"]},"
                    "{\"name\":\"b\",\"keys\":[\"secret-k\"]}]}";
    CHECK(srv_tenants_parse(t, strlen(t), &ts, &eb2) != KS_OK);
    CHECK(strstr(eb2.msg, "secret-k") == NULL);
}

// ----------------------------------------------------------------------------
// Metrics

/* Every line is a comment or `name{labels} value` with a numeric value. */
static void check_exposition(const char *text) {
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        CHECK(nl != NULL); // every line ends with \n
        if (*p != '#') {
            // the value follows the label set (whose values may hold spaces)
            const char *rb = memchr(p, '}', (size_t)(nl - p));
            const char *sp = memchr(rb ? rb : p, ' ', (size_t)(nl - (rb ? rb : p)));
            CHECK(sp != NULL);
            CHECK(!strncmp(p, "kvseal_", 7) || !strncmp(p, "vllm:", 5) ||
                  !strncmp(p, "process_", 8)); // Prometheus's standard process series
            char *end;
            strtod(sp + 1, &end);
            CHECK(end == nl);
        }
        p = nl + 1;
    }
}

static void test_metrics(void) {
    srv_metrics m;
    srv_metrics_init(&m);
    srv_metrics_request(&m, SRV_ROUTE_CHAT, 200);
    srv_metrics_request(&m, SRV_ROUTE_CHAT, 200);
    srv_metrics_request(&m, SRV_ROUTE_COMPLETIONS, 429);
    srv_metrics_request(&m, SRV_ROUTE_OTHER, 418);
    srv_metrics_reject(&m, ADMIT_CONTEXT_LENGTH);
    srv_metrics_reject(&m, ADMIT_TENANT_RATE);
    srv_metrics_reject(&m, ADMIT_TENANT_RATE);
    srv_hist_observe(&m.ttft, 0.003);
    srv_hist_observe(&m.ttft, 0.2);
    srv_hist_observe(&m.ttft, 100);
    atomic_store(&m.tokens_in, 12);
    engine_stats es;
    memset(&es, 0, sizeof es);
    es.kv.pages[KV_PAGE_FREE] = 250;
    es.kv.pages[KV_PAGE_READY] = 6;
    es.kv.violations = 0;
    es.kv.prefix_hits_pages = 9;
    es.n_queued = 3;
    es.n_running = 2;
    es.spec_drafted = 40;
    es.spec_accepted = 30;
    char *s = srv_metrics_render(&m, &es, true);
    CHECK(s);
    check_exposition(s);
    CHECK_STR_HAS(s, "# TYPE kvseal_requests_total counter\n");
    CHECK_STR_HAS(s, "kvseal_requests_total{route=\"chat_completions\",status=\"200\"} 2\n");
    CHECK_STR_HAS(s, "kvseal_requests_total{route=\"completions\",status=\"429\"} 1\n");
    CHECK_STR_HAS(s, "kvseal_requests_total{route=\"other\",status=\"other\"} 1\n");
    CHECK_STR_HAS(s, "kvseal_rejections_total{reason=\"context_length\"} 1\n");
    CHECK_STR_HAS(s, "kvseal_rejections_total{reason=\"tenant_rate\"} 2\n");
    CHECK_STR_HAS(s, "kvseal_rejections_total{reason=\"auth\"} 0\n"); // all reasons listed
    CHECK_STR_HAS(s, "kvseal_tokens_in_total 12\n");
    CHECK_STR_HAS(s, "kvseal_spec_accepted_tokens_total 30\n");
    CHECK_STR_HAS(s, "kvseal_spec_acceptance_ratio 0.750000\n");
    // cumulative buckets; +Inf equals _count
    CHECK_STR_HAS(s, "# TYPE kvseal_ttft_seconds histogram\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_bucket{le=\"0.005\"} 1\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_bucket{le=\"0.25\"} 2\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_bucket{le=\"30\"} 2\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_bucket{le=\"+Inf\"} 3\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_count 3\n");
    CHECK_STR_HAS(s, "kvseal_ttft_seconds_sum 100.203");
    CHECK_STR_HAS(s, "kvseal_tpot_seconds_count 0\n");
    CHECK_STR_HAS(s, "kvseal_kv_pages{state=\"free\"} 250\n");
    CHECK_STR_HAS(s, "kvseal_kv_pages{state=\"ready\"} 6\n");
    CHECK_STR_HAS(s, "kvseal_kv_pages{state=\"quarantine\"} 0\n");
    CHECK_STR_HAS(s, "kvseal_isolation_violations_total 0\n");
    CHECK_STR_HAS(s, "kvseal_prefix_cache_hit_pages_total 9\n");
    CHECK_STR_HAS(s, "kvseal_queue_requests 3\n");
    CHECK_STR_HAS(s, "kvseal_running_requests 2\n");
    // the process's standard series (from /proc/self), each with HELP and TYPE
    CHECK_STR_HAS(s, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ");
    CHECK_STR_HAS(s, "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ");
    CHECK_STR_HAS(s, "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes ");
    CHECK_STR_HAS(s, "# TYPE process_open_fds gauge\nprocess_open_fds ");
    CHECK_STR_HAS(s, "# TYPE process_max_fds gauge\nprocess_max_fds ");
    CHECK_STR_HAS(s, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ");
    double rss = 0, start = 0;
    long fds = 0;
    CHECK(sscanf(strstr(s, "\nprocess_resident_memory_bytes ") + 1,
                 "process_resident_memory_bytes %lf", &rss) == 1);
    CHECK(sscanf(strstr(s, "\nprocess_open_fds ") + 1, "process_open_fds %ld", &fds) == 1);
    CHECK(sscanf(strstr(s, "\nprocess_start_time_seconds ") + 1, "process_start_time_seconds %lf",
                 &start) == 1);
    CHECK(rss > 1e6); // this test's own RSS: over a MB
    CHECK(fds >= 3);  // stdin, stdout, stderr at least
    CHECK(start > (double)time(NULL) - 3600 && start <= (double)time(NULL) + 1); // started now
    free(s);
}

static void test_seclog(void) {
    char path[] = "/tmp/ks_seclog_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    server_seclog *l = NULL;
    CHECK_EQ(server_seclog_open(path, &l, NULL), KS_OK);
    server_seclog_write(l, "{\"event\":\"isolation_violation\",\"page\":3}");
    CHECK_EQ(server_seclog_count(l), 1);
    server_seclog_close(l);
    FILE *f = fopen(path, "r");
    char line[256] = {0};
    CHECK(fgets(line, sizeof line, f));
    fclose(f);
    unlink(path);
    CHECK_STR_EQ(line, "{\"event\":\"isolation_violation\",\"page\":3}\n");
    ks_errbuf eb = {0};
    CHECK_EQ(server_seclog_open("/nonexistent-dir/x.log", &l, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, "/nonexistent-dir/x.log");
}

// ----------------------------------------------------------------------------
// Issue 13: CORS, request ids, rate-limit headers, vLLM metric names

static void test_cors(void) {
    CHECK(server_cors_origin_valid("*"));
    CHECK(server_cors_origin_valid("https://app.example.com"));
    CHECK(server_cors_origin_valid("http://localhost:3000"));
    CHECK(!server_cors_origin_valid("app.example.com"));        // no scheme
    CHECK(!server_cors_origin_valid("https://a.example.com/")); // a path
    CHECK(!server_cors_origin_valid("https://"));
    CHECK(!server_cors_origin_valid("https://a b"));
    CHECK(!server_cors_origin_valid("https://*.example.com")); // no wildcards but "*"
    CHECK(!server_cors_origin_valid(""));
    CHECK(!server_cors_origin_valid(NULL));

    const char *list[] = {"https://app.example.com", "http://localhost:3000"};
    CHECK(srv_cors_origin_ok(list, 2, "https://app.example.com"));
    CHECK(srv_cors_origin_ok(list, 2, "HTTPS://APP.example.com"));
    CHECK(srv_cors_origin_ok(list, 2, "http://localhost:3000"));
    CHECK(!srv_cors_origin_ok(list, 2, "https://evil.example.com"));
    CHECK(!srv_cors_origin_ok(list, 2, "https://app.example.com.evil.net"));
    CHECK(!srv_cors_origin_ok(list, 2, "http://localhost:30001"));
    CHECK(!srv_cors_origin_ok(list, 2, NULL));
    CHECK(!srv_cors_origin_ok(list, 0, "https://app.example.com")); // CORS off
    const char *any[] = {"*"};
    CHECK(srv_cors_origin_ok(any, 1, "https://whatever.example"));
    CHECK(!srv_cors_origin_ok(any, 1, ""));

    // a preflight echoes the requested headers it allows, lowercased, drops the rest
    char out[256];
    size_t n = srv_cors_allow_headers(
        "Authorization, Content-Type,x-stainless-os , X-Evil, anthropic-version,"
        "OpenAI-Organization,x-request-id,,openai-,bad header",
        out, sizeof out);
    CHECK_STR_EQ(out, "authorization, content-type, x-stainless-os, anthropic-version, "
                      "openai-organization, x-request-id");
    CHECK_EQ(n, strlen(out));
    CHECK_EQ(srv_cors_allow_headers("x-evil", out, sizeof out), 0);
    CHECK_STR_EQ(out, "");
    CHECK_EQ(srv_cors_allow_headers(NULL, out, sizeof out), 0);
    // what does not fit is left out whole, never cut
    char small[20];
    srv_cors_allow_headers("authorization, content-type", small, sizeof small);
    CHECK_STR_EQ(small, "authorization");
}

static void test_request_id(void) {
    CHECK(srv_request_id_ok("abc-123"));
    CHECK(srv_request_id_ok("req_01J~x.y:z"));
    CHECK(!srv_request_id_ok(""));
    CHECK(!srv_request_id_ok(NULL));
    CHECK(!srv_request_id_ok("has space"));
    CHECK(!srv_request_id_ok("tab\there"));
    CHECK(!srv_request_id_ok("nl\r\nx-injected: 1"));
    CHECK(!srv_request_id_ok("caf\xc3\xa9")); // printable ASCII only
    char longid[SRV_REQUEST_ID_MAX + 2];
    memset(longid, 'a', sizeof longid);
    longid[SRV_REQUEST_ID_MAX - 1] = '\0';
    CHECK(srv_request_id_ok(longid)); // 127 bytes
    longid[SRV_REQUEST_ID_MAX - 1] = 'a';
    longid[SRV_REQUEST_ID_MAX] = '\0';
    CHECK(!srv_request_id_ok(longid)); // 128 bytes
    char a[40], b[40];
    srv_request_id_new(a, sizeof a);
    srv_request_id_new(b, sizeof b);
    CHECK_EQ(strlen(a), 32);
    CHECK(strspn(a, "0123456789abcdef") == 32);
    CHECK(strcmp(a, b) != 0);
    CHECK(srv_request_id_ok(a));
    // in a text log line: plain ids unchanged, anything else quoted and escaped
    char lv[64];
    CHECK_EQ(srv_log_value("req_01J~x.y:z", lv, sizeof lv), 13);
    CHECK_STR_EQ(lv, "req_01J~x.y:z");
    CHECK_STR_EQ((srv_log_value(a, lv, sizeof lv), lv), a);
    srv_log_value("tenant=beta", lv, sizeof lv);
    CHECK_STR_EQ(lv, "\"tenant=beta\"");
    srv_log_value("a\"b\\c d\n\xc3", lv, sizeof lv);
    CHECK_STR_EQ(lv, "\"a\\\"b\\\\c d\\x0a\\xc3\"");
    srv_log_value("", lv, sizeof lv);
    CHECK_STR_EQ(lv, "\"\"");
    srv_log_value("x=yyyyyyyyyy", lv, 8); // cut, still closed
    CHECK_STR_EQ(lv, "\"x=yyy\"");
}

static void test_ratelimit(void) {
    // Retry-After: whole seconds rounded up, never 0
    CHECK_EQ(srv_retry_after_s(0), 1);
    CHECK_EQ(srv_retry_after_s(-5), 1);
    CHECK_EQ(srv_retry_after_s(0.2), 1);
    CHECK_EQ(srv_retry_after_s(1.0), 1);
    CHECK_EQ(srv_retry_after_s(1.001), 2);
    CHECK_EQ(srv_retry_after_s(59.5), 60);
    CHECK_EQ(srv_retry_after_s(60.0), 60);
    CHECK_EQ(srv_retry_after_s(0.0 / 0.0), 1);
    // OpenAI's reset format
    char d[32];
    srv_duration_fmt(0.02, d, sizeof d);
    CHECK_STR_EQ(d, "20ms");
    srv_duration_fmt(0, d, sizeof d);
    CHECK_STR_EQ(d, "0ms");
    srv_duration_fmt(1, d, sizeof d);
    CHECK_STR_EQ(d, "1s");
    srv_duration_fmt(1.5, d, sizeof d);
    CHECK_STR_EQ(d, "1.5s");
    srv_duration_fmt(360, d, sizeof d);
    CHECK_STR_EQ(d, "6m0s");
    srv_duration_fmt(3723.5, d, sizeof d);
    CHECK_STR_EQ(d, "1h2m3.5s");
    srv_duration_fmt(59.9999, d, sizeof d);
    CHECK_STR_EQ(d, "1m0s");
    // the queue's estimate
    CHECK_EQ(srv_queue_retry_s(0, 10, 1), 1);  // nothing measured
    CHECK_EQ(srv_queue_retry_s(2.0, 3, 2), 4); // 2 s x 4 ahead / 2 at once
    CHECK_EQ(srv_queue_retry_s(0.1, 0, 4), 1);
    CHECK_EQ(srv_queue_retry_s(100, 1000, 1), SRV_QUEUE_RETRY_MAX_S);

    // tenants: 1 request per minute; 600 tokens per minute; both
    static const char *T =
        "{\"tenants\":[{\"name\":\"slow\",\"keys\":[\"k1\"],\"requests_per_minute\":1},"
        "{\"name\":\"tok\",\"keys\":[\"k2\"],\"tokens_per_minute\":600},"
        "{\"name\":\"both\",\"keys\":[\"k3\"],\"tokens_per_minute\":120,"
        "\"requests_per_minute\":6},"
        "{\"name\":\"free\",\"keys\":[\"k4\"]}]}";
    srv_tenants *ts = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(srv_tenants_parse(T, strlen(T), &ts, &eb), KS_OK);
    char msg[256];
    uint64_t t0 = 5000000000ull, S = 1000000000ull;
    srv_ratelimit rl;
    srv_tenants_ratelimit(ts, 0, 0, t0, &rl);
    CHECK(rl.requests && !rl.tokens);
    CHECK_EQ(rl.limit_requests, 1);
    CHECK_EQ(rl.remaining_requests, 1);
    CHECK_NEAR(rl.reset_requests_s, 0, 1e-9);
    CHECK_NEAR(rl.retry_s, 0, 1e-9);
    CHECK_EQ(srv_tenants_admit(ts, 0, 50, t0, msg, sizeof msg), ADMIT_OK);
    srv_tenants_release(ts, 0, 0);
    srv_tenants_ratelimit(ts, 0, 0, t0, &rl);
    CHECK_EQ(rl.remaining_requests, 0);
    CHECK_NEAR(rl.reset_requests_s, 60, 1e-6);
    CHECK_NEAR(rl.retry_s, 60, 1e-6); // the real refill time of one request
    CHECK_EQ(srv_retry_after_s(rl.retry_s), 60);
    CHECK_EQ(srv_tenants_admit(ts, 0, 50, t0 + 10 * S, msg, sizeof msg), ADMIT_TENANT_RATE);
    CHECK_STR_HAS(msg, "1 requests per minute");
    srv_tenants_ratelimit(ts, 0, 0, t0 + 10 * S, &rl);
    CHECK_NEAR(rl.retry_s, 50, 1e-6); // 10 s later: 50 s to go
    CHECK_EQ(srv_tenants_admit(ts, 0, 50, t0 + 60 * S, msg, sizeof msg), ADMIT_OK);
    srv_tenants_release(ts, 0, 0);
    // a refused request costs no request: its slot is still there after the token refusal
    srv_tenants_ratelimit(ts, 1, 0, t0, &rl);
    CHECK(!rl.requests && rl.tokens);
    CHECK_EQ(rl.limit_tokens, 600);
    CHECK_EQ(rl.remaining_tokens, 600);
    CHECK_EQ(srv_tenants_admit(ts, 1, 500, t0, msg, sizeof msg), ADMIT_OK);
    srv_tenants_ratelimit(ts, 1, 200, t0, &rl);
    CHECK_EQ(rl.remaining_tokens, 100);
    CHECK_NEAR(rl.reset_tokens_s, 50, 1e-6);     // 500 at 10/s
    CHECK_NEAR(rl.retry_s, 10, 1e-6);            // 200 wanted, 100 there: 100 at 10/s
    srv_tenants_ratelimit(ts, 1, 5000, t0, &rl); // never fits: until full
    CHECK_NEAR(rl.retry_s, 50, 1e-6);
    srv_tenants_release(ts, 1, 0);
    // both limits: the longer wait wins
    CHECK_EQ(srv_tenants_admit(ts, 2, 120, t0, msg, sizeof msg), ADMIT_OK);
    srv_tenants_release(ts, 2, 0);
    srv_tenants_ratelimit(ts, 2, 60, t0, &rl);
    CHECK_EQ(rl.remaining_requests, 5);
    CHECK_EQ(rl.remaining_tokens, 0);
    CHECK_NEAR(rl.retry_s, 30, 1e-6); // 60 tokens at 2/s; a request is there
    // no limits: no headers
    srv_tenants_ratelimit(ts, 3, 100, t0, &rl);
    CHECK(!rl.requests && !rl.tokens);
    CHECK_NEAR(rl.retry_s, 0, 1e-9);
    // bad values are refused with the field's name
    static const char *B = "{\"tenants\":[{\"name\":\"x\",\"keys\":[\"k\"],"
                           "\"requests_per_minute\":-1}]}";
    srv_tenants *bad = NULL;
    CHECK_EQ(srv_tenants_parse(B, strlen(B), &bad, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "requests_per_minute");
    srv_tenants_free(ts);
}

static void test_metrics_vllm(void) {
    static const char *T = "{\"tenants\":[{\"name\":\"acme\",\"keys\":[\"k1\"]},"
                           "{\"name\":\"we \\\"q\\\"\",\"keys\":[\"k2\"]}]}";
    srv_tenants *ts = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(srv_tenants_parse(T, strlen(T), &ts, &eb), KS_OK);
    srv_metrics m;
    srv_metrics_init(&m);
    m.ts = ts;
    m.model_name = "kjv \"mini\"";
    atomic_store(&ts->t[0].m_requests, 7);
    atomic_store(&ts->t[1].m_generation, 3);
    atomic_store(&m.tokens_in, 40);
    atomic_store(&m.tokens_out, 12);
    srv_metrics_finish(&m, ENGINE_FINISH_STOP);
    srv_metrics_finish(&m, ENGINE_FINISH_LENGTH);
    srv_metrics_finish(&m, ENGINE_FINISH_LENGTH);
    srv_metrics_finish(&m, ENGINE_FINISH_ERROR);
    srv_hist_observe(&m.e2e, 0.7);
    srv_hist_observe(&m.e2e, 700);
    srv_hist_observe(&m.queue, 0.002);
    engine_stats es;
    memset(&es, 0, sizeof es);
    es.kv.pages[KV_PAGE_FREE] = 75;
    es.kv.pages[KV_PAGE_READY] = 20;
    es.kv.pages[KV_PAGE_ALLOCATED] = 5;
    es.n_queued = 4;
    es.n_running = 3;
    char *s = srv_metrics_render(&m, &es, true);
    CHECK(s);
    check_exposition(s);
    const char *L = "{model_name=\"kjv \\\"mini\\\"\"}"; // escaped label value
    char want[256];
#define HAS_L(fmt, ...)                                                                            \
    do {                                                                                           \
        snprintf(want, sizeof want, fmt, __VA_ARGS__);                                             \
        CHECK_STR_HAS(s, want);                                                                    \
    } while (0)
    HAS_L("kvseal_model_info%s 1\n", L);
    HAS_L("vllm:num_requests_running%s 3\n", L);
    HAS_L("vllm:num_requests_waiting%s 4\n", L);
    HAS_L("vllm:kv_cache_usage_perc%s 0.250000\n", L);
    HAS_L("vllm:gpu_cache_usage_perc%s 0.250000\n", L);
    HAS_L("vllm:prompt_tokens_total%s 40\n", L);
    HAS_L("vllm:generation_tokens_total%s 12\n", L);
    CHECK_STR_HAS(s, "# TYPE vllm:num_requests_running gauge\n");
    CHECK_STR_HAS(s, "# TYPE vllm:prompt_tokens_total counter\n");
    CHECK_STR_HAS(s, "# TYPE vllm:e2e_request_latency_seconds histogram\n");
    CHECK_STR_HAS(s, "vllm:request_success_total{finished_reason=\"stop\",model_name=\"kjv "
                     "\\\"mini\\\"\"} 1\n");
    CHECK_STR_HAS(s, "vllm:request_success_total{finished_reason=\"length\",model_name=\"kjv "
                     "\\\"mini\\\"\"} 2\n");
    CHECK_STR_HAS(s, "vllm:request_success_total{finished_reason=\"abort\",model_name=\"kjv "
                     "\\\"mini\\\"\"} 1\n");
    CHECK_STR_HAS(s, "vllm:e2e_request_latency_seconds_bucket{model_name=\"kjv \\\"mini\\\"\","
                     "le=\"1\"} 1\n");
    CHECK_STR_HAS(s, "vllm:e2e_request_latency_seconds_bucket{model_name=\"kjv \\\"mini\\\"\","
                     "le=\"+Inf\"} 2\n");
    HAS_L("vllm:e2e_request_latency_seconds_count%s 2\n", L);
    HAS_L("vllm:request_queue_time_seconds_count%s 1\n", L);
    HAS_L("vllm:time_to_first_token_seconds_count%s 0\n", L);
    HAS_L("vllm:time_per_output_token_seconds_count%s 0\n", L);
    CHECK_STR_HAS(s, "kvseal_e2e_request_latency_seconds_count 2\n");
    CHECK_STR_HAS(s, "kvseal_request_queue_time_seconds_bucket{le=\"0.005\"} 1\n");
    CHECK_STR_HAS(s, "kvseal_kv_usage_ratio 0.250000\n");
    CHECK_STR_HAS(s, "kvseal_tenant_requests_total{tenant=\"acme\"} 7\n");
    CHECK_STR_HAS(s, "kvseal_tenant_requests_total{tenant=\"we \\\"q\\\"\"} 0\n");
    CHECK_STR_HAS(s, "kvseal_tenant_generation_tokens_total{tenant=\"we \\\"q\\\"\"} 3\n");
    CHECK_STR_HAS(s, "kvseal_tenant_rate_limited_total{tenant=\"acme\"} 0\n");
#undef HAS_L
    free(s);
    // an empty pool (a router before any decode worker): usage 0, not NaN
    memset(&es, 0, sizeof es);
    s = srv_metrics_render(&m, &es, true);
    CHECK(s);
    CHECK_STR_HAS(s, "kvseal_kv_usage_ratio 0.000000\n");
    free(s);
    srv_buf b = {0};
    CHECK(srv_prom_label(&b, "a\\b\"c\nd"));
    CHECK_STR_EQ(b.p, "a\\\\b\\\"c\\nd");
    srv_buf_free(&b);
    srv_tenants_free(ts);
}

/* Issue 39: the failures after admission come from the refusal table
 * (ADMIT_FAILURE rows) and answer exactly as srv_fail did, but are no
 * refusals (reason ADMIT_OK: kvseal_rejections_total does not count them). */
static void test_failures_table(void) {
    static const struct {
        admit_reason r;
        int status;
        const char *code, *type;
    } want[] = {
        {ADMIT_CLIENT_CLOSED, 499, "client_closed", "invalid_request_error"},
        {ADMIT_UPSTREAM_ERROR, 502, "upstream_error", "server_error"},
        {ADMIT_WORKER_UNAVAILABLE, 503, "worker_unavailable", "server_error"},
        {ADMIT_UPSTREAM_TIMEOUT, 504, "upstream_timeout", "server_error"},
        {ADMIT_SHUTDOWN_ABORTED, 503, "server_shutting_down", "server_error"},
        {ADMIT_RUN_ABORTED, 503, "request_aborted", "server_error"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        srv_error a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        srv_refuse(&a, want[i].r, NULL, "m");
        srv_fail(&b, want[i].status, want[i].code, "m");
        CHECK_EQ(a.status, want[i].status);
        CHECK_STR_EQ(a.code, want[i].code);
        CHECK_STR_EQ(a.type, want[i].type);
        CHECK_EQ(a.reason, ADMIT_OK);
        CHECK_EQ(a.workers_code, b.workers_code);
        CHECK_STR_EQ(a.type, b.type);
    }
}

int main(void) {
    CHECK(sodium_init() >= 0);
    test_failures_table();
    test_request_valid();
    test_request_invalid();
    test_prompt_bound();
    test_content_parts();
    test_framing();
    test_error_shapes();
    test_sse();
    test_tenants();
    test_metrics();
    test_seclog();
    test_cors();
    test_request_id();
    test_ratelimit();
    test_metrics_vllm();
    printf("server ok\n");
    return 0;
}
