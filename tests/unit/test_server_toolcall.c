/* test_server_toolcall.c — tool calls and reasoning out of a model's text
 * (src/server/toolcall.c): every family's format (fixtures written from the
 * formats their templates render, see toolcall.h), malformed and unfinished
 * calls staying content byte for byte, unicode, several calls, text around
 * calls, reasoning, limits; the streaming parser fed the same text split at
 * every byte boundary, byte by byte and in token-like chunks giving exactly
 * the one-shot result; format detection on ../shared/templates; the request
 * fields (tools, tool_choice, parallel_tool_calls) and the call grammar. */
#include "../check.h"
#include "server/server_int.h"

#include <sodium.h>

// ----------------------------------------------------------------------------
// Helpers

/* A parse's result in one comparable string set. */
typedef struct result {
    char content[2 * TOOLCALL_MAX_CALL_BYTES], reasoning[1024]; /* calls: "name args\n" each */
    char calls[2 * TOOLCALL_MAX_CALL_BYTES];
    char ids[1024]; /* "id\n" each */
} result;

static void collect(toolcall_parser *p, result *r) {
    size_t n;
    const char *s = toolcall_parser_content(p, &n);
    CHECK(n < sizeof r->content);
    memcpy(r->content, s, n);
    r->content[n] = '\0';
    s = toolcall_parser_reasoning(p, &n);
    CHECK(n < sizeof r->reasoning);
    memcpy(r->reasoning, s, n);
    r->reasoning[n] = '\0';
    r->calls[0] = r->ids[0] = '\0';
    for (int i = 0; i < toolcall_parser_n_calls(p); i++) {
        const toolcall_call *c = toolcall_parser_call(p, i);
        size_t l = strlen(r->calls);
        snprintf(r->calls + l, sizeof r->calls - l, "%s %s\n", c->name, c->arguments);
        l = strlen(r->ids);
        snprintf(r->ids + l, sizeof r->ids - l, "%s\n", c->id);
    }
}

/* Feeds text in the chunks cuts gives (n_cuts positions, increasing) and
 * checks that the deltas add up to what the parser holds. */
static void feed(const toolcall_cfg *cfg, const char *text, const size_t *cuts, int n_cuts,
                 result *r) {
    toolcall_parser *p;
    CHECK(toolcall_parser_create(cfg, &p) == KS_OK);
    static char content[2 * TOOLCALL_MAX_CALL_BYTES], reasoning[8192];
    size_t cl = 0, rl = 0, len = strlen(text), at = 0;
    int calls = 0;
    toolcall_delta d;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        CHECK(toolcall_parser_push(p, text + at, to - at, &d) == KS_OK);
        at = to;
        memcpy(content + cl, d.content, d.content_len), cl += d.content_len;
        memcpy(reasoning + rl, d.reasoning, d.reasoning_len), rl += d.reasoning_len;
        CHECK_EQ(d.first_call, calls);
        calls += d.n_calls;
    }
    CHECK(toolcall_parser_finish(p, &d) == KS_OK);
    memcpy(content + cl, d.content, d.content_len), cl += d.content_len;
    memcpy(reasoning + rl, d.reasoning, d.reasoning_len), rl += d.reasoning_len;
    CHECK_EQ(d.first_call, calls);
    calls += d.n_calls;
    CHECK_EQ(calls, toolcall_parser_n_calls(p));
    collect(p, r);
    bool ws = true; // whitespace-only content beside calls is never sent
    for (const char *c = r->content; *c && ws; c++)
        ws = *c == ' ' || *c == '\n' || *c == '\t' || *c == '\r';
    if (ws && calls) {
        CHECK_EQ(cl, 0);
    } else {
        CHECK_EQ(cl, strlen(r->content));
        CHECK_MEM_EQ(content, r->content, cl);
    }
    CHECK_EQ(rl, strlen(r->reasoning));
    CHECK_MEM_EQ(reasoning, r->reasoning, rl);
    // after finish nothing more comes
    CHECK(toolcall_parser_push(p, "x", 1, &d) == KS_OK);
    CHECK(d.content_len == 0 && d.n_calls == 0);
    toolcall_parser_destroy(p);
}

static void oneshot(const toolcall_cfg *cfg, const char *text, result *r) {
    feed(cfg, text, NULL, 0, r);
}

static void same(const result *a, const result *b, const char *text, const char *how) {
    if (strcmp(a->content, b->content) || strcmp(a->reasoning, b->reasoning) ||
        strcmp(a->calls, b->calls)) {
        fprintf(stderr,
                "split (%s) differs for [%s]:\n content [%s] vs [%s]\n reasoning [%s] vs "
                "[%s]\n calls [%s] vs [%s]\n",
                how, text, a->content, b->content, a->reasoning, b->reasoning, a->calls, b->calls);
        CHECK(!"streamed result differs from the one-shot result");
    }
}

/* The streaming parser gives the one-shot result for every split. */
static void splits(const toolcall_cfg *cfg, const char *text, const result *want) {
    size_t len = strlen(text);
    result r;
    for (size_t cut = 0; cut <= len; cut++) { // two pieces, at every byte boundary
        feed(cfg, text, &cut, 1, &r);
        same(want, &r, text, "two pieces");
    }
    static size_t cuts[8192];
    CHECK(len < 8192);
    for (size_t i = 0; i < len; i++) // byte by byte
        cuts[i] = i + 1;
    feed(cfg, text, cuts, len ? (int)len - 1 : 0, &r);
    same(want, &r, text, "byte by byte");
    uint32_t x = 12345; // token-like chunks of 1..8 bytes, three different draws
    for (int rep = 0; rep < 3; rep++) {
        int n = 0;
        for (size_t at = 0;;) {
            x = x * 1103515245u + 12345u;
            at += 1 + (x >> 16) % 8;
            if (at >= len) break;
            cuts[n++] = at;
        }
        feed(cfg, text, cuts, n, &r);
        same(want, &r, text, "chunks");
    }
}

/* Parses text (one-shot, then every split) and checks content, reasoning
 * and calls ("name args\n" each; NULL: none). */
static void expect(const toolcall_cfg *cfg, const char *text, const char *content,
                   const char *reasoning, const char *calls) {
    result r;
    oneshot(cfg, text, &r);
    if (strcmp(r.content, content) || strcmp(r.reasoning, reasoning ? reasoning : "") ||
        strcmp(r.calls, calls ? calls : "")) {
        fprintf(stderr,
                "[%s]\n content [%s] want [%s]\n reasoning [%s] want [%s]\n calls [%s] want [%s]\n",
                text, r.content, content, r.reasoning, reasoning ? reasoning : "", r.calls,
                calls ? calls : "");
        CHECK(!"parse result");
    }
    splits(cfg, text, &r);
}

/* Each of the n texts holds no call (malformed, unfinished): it stays
 * content, byte for byte, however it is split. */
static void expect_content(const toolcall_cfg *cfg, const char *const *texts, size_t n) {
    for (size_t i = 0; i < n; i++)
        expect(cfg, texts[i], texts[i], NULL, NULL);
}

static toolcall_cfg cfg_of(toolcall_format f) {
    toolcall_cfg c = {.format = f};
    return c;
}

// ----------------------------------------------------------------------------
// Families

static void test_hermes(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_HERMES);
    expect(&c,
           "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
           "\"Paris\", \"days\": 3}}\n</tool_call>",
           "Let me check.\n", NULL, "get_weather {\"city\":\"Paris\",\"days\":3}\n");
    // several calls, text after
    expect(
        &c,
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
        "\"b\", \"arguments\": {\"x\": [1, 2, {\"y\": null}]}}\n</tool_call> done",
        "\n done", NULL, "a {}\nb {\"x\":[1,2,{\"y\":null}]}\n");
    // unicode (raw and escaped), escapes and braces inside strings
    expect(&c,
           "<tool_call>{\"name\": \"say\", \"arguments\": {\"text\": \"Zürich ☃ \\u00e9 "
           "\\\"}{\\\" \\n\"}}</tool_call>",
           "", NULL, "say {\"text\":\"Zürich ☃ é \\\"}{\\\" \\n\"}\n");
    // arguments written as a JSON string; numbers keep their value
    expect(&c, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", "",
           NULL, "f {\"a\":1}\n");
    expect(&c,
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 0.1, \"y\": -3, \"z\": "
           "1.5e300}}</tool_call>",
           "", NULL, "f {\"x\":0.1,\"y\":-3,\"z\":1.5e300}\n");
    // the end tag missing at the very end of the answer
    expect(&c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", "\n", NULL, "f {}\n");
    // ... but not before more text: the call ends at its JSON
    expect(&c, "<tool_call>{\"name\": \"f\", \"arguments\": {}} and more", " and more", NULL,
           "f {}\n");
    // malformed: stays content, byte for byte
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {]}\n</tool_call>",
        "<tool_call>{\"foo\": 1}</tool_call>",
        "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
        "<tool_call>not json</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"argu", // unfinished
        "text <tool_ca",                         // a marker's prefix at the end
        "<tool_call>",
        ("<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": "
         "\"\\ud800\"}}</tool_call>"), // lone surrogate
    };
    expect_content(&c, bad, sizeof bad / sizeof *bad);
    // a bad call next to good ones: only the bad one is content
    expect(&c,
           "<tool_call>{\"x\":1}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": "
           "{}}</tool_call>",
           "<tool_call>{\"x\":1}</tool_call>", NULL, "g {}\n");
    expect(&c, "no calls at all < tool_call >", "no calls at all < tool_call >", NULL, NULL);
}

static void test_qwen3_coder(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_QWEN3_CODER);
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"zip\":{\"type\":\"string\"}}}}}]",
        0, NULL);
    CHECK(tools);
    c.tools = tools;
    expect(
        &c,
        "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n</function>\n"
        "</tool_call>",
        "I'll look.\n", NULL, "get_weather {\"city\":\"Paris\",\"days\":3,\"zip\":\"75001\"}\n");
    // without a schema: JSON values are JSON, the rest strings; multi-line values
    c.tools = NULL;
    expect(&c,
           "<tool_call>\n<function=run>\n<parameter=code>\nprint(1)\nprint(\"é\")\n</parameter>\n"
           "<parameter=opts>\n{\"a\": [true]}\n</parameter>\n<parameter=n>\n-2.5\n</parameter>\n"
           "</function>\n</tool_call>\n<tool_call>\n<function=noargs>\n</function>\n</tool_call>",
           "\n", NULL,
           "run {\"code\":\"print(1)\\nprint(\\\"é\\\")\",\"opts\":{\"a\":[true]},\"n\":-2.5}\n"
           "noargs {}\n");
    const char *bad[] = {
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n", // unfinished
        "<tool_call>\n<func=f></func>\n</tool_call>",
        "<tool_call>\n<function=f>\n<oops>\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
    };
    expect_content(&c, bad, sizeof bad / sizeof *bad);
    json_decref(tools);
}

static void test_llama3(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_LLAMA3);
    expect(&c, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", NULL,
           "get_weather {\"city\":\"Paris\"}\n");
    expect(&c, "\n <|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "\n ", NULL, "f {}\n");
    expect(&c, "  {\"name\": \"f\", \"arguments\": {\"a\": 1}}", "  ", NULL, "f {\"a\":1}\n");
    // JSON that is not a call, or not the whole answer, is content
    expect(&c, "{\"answer\": 42}", "{\"answer\": 42}", NULL, NULL);
    expect(&c, "Sure: {\"name\": \"f\", \"parameters\": {}}",
           "Sure: {\"name\": \"f\", \"parameters\": {}}", NULL, NULL);
    expect(&c, "{\"name\": \"f\", \"param", "{\"name\": \"f\", \"param", NULL, NULL);
    expect(&c, "<|python_tag|>brave_search.call(query=\"x\")",
           "<|python_tag|>brave_search.call(query=\"x\")", NULL, NULL);
    expect(&c, "Hello there", "Hello there", NULL, NULL);
}

static void test_mistral(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_MISTRAL);
    expect(&c,
           "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
           "\"abc123XYZ\"}, {\"name\": \"t\", \"arguments\": {}}]",
           "", NULL, "get_weather {\"city\":\"Paris\"}\nt {}\n");
    result r;
    oneshot(&c,
            "[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {}, \"id\": \"abc123XYZ\"}, {\"name\": "
            "\"t\", \"arguments\": {}}]",
            &r);
    CHECK(!strncmp(r.ids, "abc123XYZ\n", 10)); // the model's id is kept
    const char *id2 = r.ids + 10;              // a drawn one: 9 alphanumerics (the templates' rule)
    CHECK_EQ(strlen(id2), 10);
    for (int i = 0; i < 9; i++)
        CHECK((id2[i] >= 'a' && id2[i] <= 'z') || (id2[i] >= 'A' && id2[i] <= 'Z') ||
              (id2[i] >= '0' && id2[i] <= '9'));
    // the newer form, with and without [CALL_ID]
    expect(&c, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}", "",
           NULL, "get_weather {\"city\":\"Paris\"}\nget_time {}\n");
    expect(&c, "Sure.[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"x\": \"ü\"} ok", "Sure. ok", NULL,
           "f {\"x\":\"ü\"}\n");
    oneshot(&c, "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{}", &r);
    CHECK_STR_EQ(r.ids, "a1b2c3d4e\n");
    const char *bad[] = {"[TOOL_CALLS]", "[TOOL_CALLS]f[ARGS]{\"x\":", "[TOOL_CALLS][{\"x\": 1}]",
                         "[TOOL_CALLS]f[ARGS]nope", "[TOOL_CALLS][]"};
    expect_content(&c, bad, sizeof bad / sizeof *bad);
}

static void test_glm(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_GLM45);
    expect(&c,
           "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n<arg_key>"
           "days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>now\n</tool_call>",
           "\n", NULL, "get_weather {\"city\":\"北京\",\"days\":3}\nnow {}\n");
    expect(&c, "<tool_call>f<arg_key>a</arg_key><arg_value>[1,2]</arg_value></tool_call>", "", NULL,
           "f {\"a\":[1,2]}\n");
    const char *bad[] = {
        "<tool_call>{\"name\": \"f\"}</tool_call>",
        "<tool_call>f\n<arg_key>a</arg_key>\n<oops>",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1",
    };
    expect_content(&c, bad, sizeof bad / sizeof *bad);
}

#define B "<｜tool▁calls▁begin｜>"
#define E "<｜tool▁calls▁end｜>"
#define CB "<｜tool▁call▁begin｜>"
#define SEP "<｜tool▁sep｜>"
#define CE "<｜tool▁call▁end｜>"

static void test_deepseek(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_DEEPSEEK);
    // R1 / V3
    expect(&c,
           "Checking." B CB "function" SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" CE
           "\n" CB "function" SEP "get_time\n```json\n{}\n```" CE E,
           "Checking.", NULL, "get_weather {\"city\":\"Paris\"}\nget_time {}\n");
    // V3.1
    expect(&c, B CB "get_weather" SEP "{\"city\": \"Paris\"}" CE E " after", " after", NULL,
           "get_weather {\"city\":\"Paris\"}\n");
    // a V3.1 argument holding a fence stays a V3.1 call
    expect(&c, B CB "f" SEP "{\"code\": \"```x```\"}" CE E, "", NULL, "f {\"code\":\"```x```\"}\n");
    // section end missing at the very end; a lone call without a section
    expect(&c, B CB "f" SEP "{}" CE, "", NULL, "f {}\n");
    expect(&c, "x" CB "f" SEP "{}" CE "y", "xy", NULL, "f {}\n");
    const char *bad[] = {B, B CB "f" SEP "{", B CB "f" SEP "nope" CE E, B E, B CB "nosep" CE E};
    expect_content(&c, bad, sizeof bad / sizeof *bad);
}

#define DT "｜DSML｜"
#define D "<" DT

static void test_dsml(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_DSML);
    expect(&c,
           "Let me see.\n\n" D "function_calls>\n" D "invoke name=\"get_weather\">\n" D
           "parameter name=\"city\" string=\"true\">Paris</" DT "parameter>\n" D
           "parameter name=\"days\" string=\"false\">3</" DT "parameter>\n" D
           "parameter name=\"zip\" string=\"true\">75001</" DT "parameter>\n</" DT "invoke>\n" D
           "invoke name=\"now\">\n</" DT "invoke>\n</" DT "function_calls>",
           "Let me see.\n\n", NULL,
           "get_weather {\"city\":\"Paris\",\"days\":3,\"zip\":\"75001\"}\nnow {}\n");
    // V4's section name
    expect(&c, D "tool_calls>\n" D "invoke name=\"f\">\n</" DT "invoke>\n</" DT "tool_calls>", "",
           NULL, "f {}\n");
    const char *bad[] = {D "function_calls>\n" D "invoke name=\"f\">\n" D "parameter name=\"a\">",
                         D "function_calls>\n" D "invoke name=\"f\">\n<x>\n</" DT "invoke>\n</" DT
                           "function_calls>"};
    expect_content(&c, bad, sizeof bad / sizeof *bad);
}

static void test_kimi(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_KIMI_K2);
    const char *t = "ok<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                    "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
                    "<|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}"
                    "<|tool_call_end|><|tool_calls_section_end|>";
    expect(&c, t, "ok", NULL, "get_weather {\"city\":\"Paris\"}\nnow {}\n");
    result r;
    oneshot(&c, t, &r);
    CHECK_STR_EQ(r.ids, "functions.get_weather:0\nfunctions.now:1\n"); // the template reuses them
}

static void test_json_lists(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_NEMOTRON);
    expect(&c,
           "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
           "{\"name\": \"now\", \"arguments\": \"{}\"}]</TOOLCALL>",
           "", NULL, "get_weather {\"city\":\"Paris\"}\nnow {}\n");
    expect(&c, "<TOOLCALL>[{\"x\": 1}]</TOOLCALL>", "<TOOLCALL>[{\"x\": 1}]</TOOLCALL>", NULL,
           NULL);
    c = cfg_of(TOOLCALL_APRIEL);
    expect(&c, "Sure\n<tool_calls>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]</tool_calls>",
           "Sure\n", NULL, "f {\"a\":1}\n");
    c = cfg_of(TOOLCALL_GRANITE);
    expect(&c, "<|tool_call|>[{\"name\": \"f\", \"arguments\": {}}]", "", NULL, "f {}\n");
    expect(&c, "<|tool_call|>[", "<|tool_call|>[", NULL, NULL);
    c = cfg_of(TOOLCALL_FIREFUNCTION);
    expect(&c, " functools[{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]", " ", NULL,
           "f {\"q\":\"x\"}\n");
    expect(&c, "functools[oops", "functools[oops", NULL, NULL);
    c = cfg_of(TOOLCALL_SEED_OSS);
    expect(&c,
           "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
           "<parameter=days>3</parameter>\n</function>\n</seed:tool_call>",
           "", NULL, "get_weather {\"city\":\"Paris\",\"days\":3}\n");
    expect(&c, "<seed:tool_call>\n<function=f>\n", "<seed:tool_call>\n<function=f>\n", NULL, NULL);
}

// ----------------------------------------------------------------------------
// Reasoning

static void test_reasoning(void) {
    toolcall_cfg c = {.format = TOOLCALL_NONE, .think_open = "<think>", .think_close = "</think>"};
    expect(&c, "<think>\nI should check.\n</think>\n\nThe answer.", "The answer.",
           "\nI should check.\n", NULL);
    expect(&c, "\n<think>a</think>b", "b", "a", NULL);
    expect(&c, "<think>unclosed", "", "unclosed", NULL);
    expect(&c, "Hello <think>x</think>", "Hello <think>x</think>", "", NULL); // only at the start
    expect(&c, "<thi", "<thi", "", NULL);
    expect(&c, "  ", "  ", "", NULL);
    expect(&c, "", "", "", NULL);
    // a think block only comes first: after 4 KiB of whitespace it is content
    static char ws[6000];
    memset(ws, ' ', 5000);
    strcpy(ws + 5000, "<think>x</think>");
    expect(&c, ws, ws, "", NULL);
    memset(ws, 0, sizeof ws);
    memset(ws, '\n', 4096);
    strcpy(ws + 4096, "<think>x</think>y");
    expect(&c, ws, "y", "x", NULL);
    // the prompt opened the block (DeepSeek-R1, QwQ)
    c.in_reasoning = true;
    expect(&c, "I think.\n</think>\n\nAnswer </think>", "Answer </think>", "I think.\n", NULL);
    expect(&c, "all reasoning </thi", "", "all reasoning </thi", NULL);
    // Seed's markers; reasoning with tool calls after it
    toolcall_cfg s = {
        .format = TOOLCALL_HERMES, .think_open = "<seed:think>", .think_close = "</seed:think>"};
    expect(&s,
           "<seed:think>hm</seed:think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
           "", "hm", "f {}\n");
    CHECK(toolcall_prompt_opens_think("<｜Assistant｜><think>\n",
                                      strlen("<｜Assistant｜><think>\n"), "<think>"));
    CHECK(!toolcall_prompt_opens_think("<think>x</think>\n", 17, "<think>"));
    CHECK(!toolcall_prompt_opens_think("<think>", 7, NULL));
    // markers the server feeds from special tokens
    CHECK(toolcall_is_marker(&s, "<seed:think>", 12));
    CHECK(toolcall_is_marker(&s, "<tool_call>", 11));
    CHECK(!toolcall_is_marker(&s, "<|im_end|>", 10));
    toolcall_cfg d = cfg_of(TOOLCALL_DEEPSEEK);
    CHECK(toolcall_is_marker(&d, CB, strlen(CB)));
    CHECK(!toolcall_is_marker(&d, "<｜end▁of▁sentence｜>", strlen("<｜end▁of▁sentence｜>")));
}

// ----------------------------------------------------------------------------
// Limits

/* gpt-oss's harmony format: the analysis channel is the reasoning, the
 * final channel's header is dropped, however the text is split (its markers
 * are several tokens: each special token of them is a marker). */
static void test_harmony(void) {
    const char *o, *cl;
    CHECK(toolcall_think_detect("{{ '<|channel|>analysis<|message|>' }}{{ '<|channel|>final' }}", &o,
                                &cl));
    CHECK(!strcmp(o, HARMONY_ANALYSIS) && !strcmp(cl, HARMONY_END));
    toolcall_cfg c = {.format = TOOLCALL_NONE, .think_open = o, .think_close = cl};
    expect(&c,
           "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>"
           "final<|message|>Hello!",
           "Hello!", "The user greets.", NULL);
    expect(&c, "<|channel|>final<|message|>Hi there", "Hi there", NULL, NULL);
    expect(&c, "<|channel|>analysis<|message|>unfinished", "", "unfinished", NULL);
    expect(&c, "plain text", "plain text", NULL, NULL);
    expect(&c, "<|channel|>analysis<|message|>a<|end|>no header", "no header", "a", NULL);
    CHECK(toolcall_is_marker(&c, "<|channel|>", 11));
    CHECK(toolcall_is_marker(&c, "<|message|>", 11));
    CHECK(toolcall_is_marker(&c, "<|start|>", 9));
    CHECK(toolcall_is_marker(&c, "<|end|>", 7));
    CHECK(toolcall_is_marker(&c, "<|return|>", 10));
    CHECK(!toolcall_is_marker(&c, "<|endoftext|>", 13));
    toolcall_cfg t = {.format = TOOLCALL_NONE, .think_open = "<think>", .think_close = "</think>"};
    CHECK(!toolcall_is_marker(&t, "<|channel|>", 11));
    // a later analysis message, a commentary preamble, ends of messages: formatting
    expect(&c,
           "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>"
           "b<|end|><|start|>assistant<|channel|>final<|message|>done<|return|>",
           "done", "ab", NULL);
}

/* harmony's tool calls: the recipient functions.NAME in the role header or
 * the channel header, the arguments JSON up to <|call|> (an end of
 * generation, so usually the end of the text); each split gives the same. */
static void test_harmony_calls(void) {
    CHECK_EQ(toolcall_format_detect("{{- \"<|start|>assistant to=\" }}{{- \"functions.\" + "
                                    "tool_call.name + \"<|channel|>commentary \" }}"),
             TOOLCALL_HARMONY);
    toolcall_cfg c = {.format = TOOLCALL_HARMONY, .think_open = HARMONY_ANALYSIS,
                      .think_close = HARMONY_END};
    // the recipient in the channel header, after the analysis
    expect(&c,
           "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
           "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
           "", "Need the weather.", "get_weather {\"city\":\"Paris\"}\n");
    // in the role header, right after the prompt's <|start|>assistant; <|call|> fed
    expect(&c, " to=functions.now<|channel|>commentary json<|message|>{}<|call|>", "", NULL,
           "now {}\n");
    expect(&c,
           "<|start|>assistant to=functions.f_1<|channel|>commentary json<|message|> {\"x\": [1, "
           "{\"y\": \"}<|end|>\"}]} ",
           "", NULL, "f_1 {\"x\":[1,{\"y\":\"}<|end|>\"}]}\n");
    // a commentary preamble before the call is content
    expect(&c,
           "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.now <|constrain|>json<|message|>{}<|call|>",
           "Checking.", NULL, "now {}\n");
    // arguments that are not JSON: the call stays content, byte for byte
    expect(&c, "<|channel|>commentary to=functions.now json<|message|>{oops",
           "<|channel|>commentary to=functions.now json<|message|>{oops", NULL, NULL);
    // no tools asked for: a call's header is formatting, its text content
    toolcall_cfg n = c;
    n.format = TOOLCALL_NONE;
    expect(&n, "<|channel|>commentary to=functions.now json<|message|>{}", "{}", NULL, NULL);
    // no reasoning split asked for: calls still parse; analysis is content
    toolcall_cfg r = cfg_of(TOOLCALL_HARMONY);
    expect(&r,
           "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.now"
           "<|channel|>commentary json<|message|>{}",
           "hm", NULL, "now {}\n");
    // a header's mark that starts no header is content (it once looped forever)
    static char longhead[700];
    snprintf(longhead, sizeof longhead, "<|channel|>%0600d", 0);
    expect(&c, longhead, longhead, NULL, NULL);
    expect(&c, "x<|start|>assistant<|end|>y", "x<|start|>assistanty", NULL, NULL);
    CHECK(toolcall_is_marker(&r, "<|constrain|>", 13));
    CHECK(toolcall_is_marker(&r, "<|call|>", 8));
}

/* Gemma 4: <|tool_call>call:NAME{key:value,...}<tool_call|>, its values
 * in the template's own notation (strings between <|"|> marks, bare keys,
 * JSON numbers and literals, nested {} and []), turned into JSON; the
 * thought channel (<|channel>thought ... <channel|>) is the reasoning. */
static bool grammar_takes(const char *g, const char *text);

static void test_gemma4(void) {
    const char *src = "{{- '<|tool_call>call:' + function['name'] + '{' -}}"
                      "{{- '<|channel>thought\\n' -}}{{- '<channel|>' -}}";
    CHECK_EQ(toolcall_format_detect(src), TOOLCALL_GEMMA4);
    const char *o, *cl;
    CHECK(toolcall_think_detect(src, &o, &cl));
    CHECK(!strcmp(o, "<|channel>thought\n") && !strcmp(cl, "<channel|>"));
    toolcall_cfg c = {.format = TOOLCALL_GEMMA4, .think_open = o, .think_close = cl};
    expect(&c,
           "<|channel>thought\nThe weather.<channel|>Let me see.<|tool_call>call:get_weather{"
           "city:<|\"|>Paris, \"FR\"<|\"|>,days:3,metric:true,tags:[<|\"|>a<|\"|>,2.5],opt:{x:null}}"
           "<tool_call|>",
           "Let me see.", "The weather.",
           "get_weather {\"city\":\"Paris, \\\"FR\\\"\",\"days\":3,\"metric\":true,\"tags\":[\"a\","
           "2.5],\"opt\":{\"x\":null}}\n");
    // two calls, no arguments, a string with the notation's own brackets in it
    expect(&c,
           "<|tool_call>call:now{}<tool_call|><|tool_call>call:say{text:<|\"|>{a:[b]}<|\"|>}"
           "<tool_call|>",
           "", NULL, "now {}\nsay {\"text\":\"{a:[b]}\"}\n");
    // malformed or unfinished: content, byte for byte
    static const char *const bad[] = {
        "<|tool_call>call:f{a:<|\"|>open}<tool_call|>",
        "<|tool_call>call:f{a 1}<tool_call|>",
        "<|tool_call>call:{}<tool_call|>",
        "<|tool_call>call:f{a:[1,}<tool_call|>",
        "<|tool_call>call:f{a:1",
        "<|tool_call>f{}<tool_call|>",
    };
    expect_content(&c, bad, sizeof bad / sizeof *bad);
    CHECK(toolcall_is_marker(&c, "<|tool_call>", 12));
    CHECK(toolcall_is_marker(&c, "<tool_call|>", 12));
    CHECK(toolcall_is_marker(&c, "<|\"|>", 5));
    CHECK(toolcall_is_marker(&c, "<|channel>", 10));
    CHECK(toolcall_is_marker(&c, "<channel|>", 10));
    CHECK(!toolcall_is_marker(&c, "<turn|>", 7));
    // the call grammar takes the tool's parameter names as keys, nothing else
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]",
        0, NULL);
    char *g = toolcall_grammar(TOOLCALL_GEMMA4, tools, NULL);
    CHECK(grammar_takes(g, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>"));
    CHECK(grammar_takes(g, "<|tool_call>call:get_weather{days:[1,{a:true}]}<tool_call|>"));
    CHECK(grammar_takes(g, "<|tool_call>call:now{}<tool_call|>"));
    CHECK(!grammar_takes(g, "<|tool_call>call:get_weather{town:1}<tool_call|>"));
    CHECK(!grammar_takes(g, "<|tool_call>call:now{x:1}<tool_call|>"));
    CHECK(!grammar_takes(g, "<|tool_call>call:other{}<tool_call|>"));
    free(g);
    json_decref(tools);
}

static void test_limits(void) {
    toolcall_cfg c = cfg_of(TOOLCALL_HERMES);
    // past TOOLCALL_MAX_CALLS calls, the rest is content
    static char text[16384];
    size_t n = 0;
    const char *one = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    for (int i = 0; i < TOOLCALL_MAX_CALLS + 2; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s", one);
    result r;
    oneshot(&c, text, &r);
    size_t calls = 0;
    for (const char *p = r.calls; (p = strchr(p, '\n')); p++)
        calls++;
    CHECK_EQ(calls, TOOLCALL_MAX_CALLS);
    char rest[256];
    snprintf(rest, sizeof rest, "%s%s", one, one);
    CHECK_STR_EQ(r.content, rest);
    // nesting deeper than TOOLCALL_MAX_DEPTH: content
    n = (size_t)snprintf(text, sizeof text, "<tool_call>{\"name\": \"f\", \"arguments\": ");
    for (int i = 0; i < TOOLCALL_MAX_DEPTH + 5; i++)
        text[n++] = '[';
    for (int i = 0; i < TOOLCALL_MAX_DEPTH + 5; i++)
        text[n++] = ']';
    n += (size_t)snprintf(text + n, sizeof text - n, "}</tool_call>");
    oneshot(&c, text, &r);
    CHECK_STR_EQ(r.calls, "");
    CHECK_STR_EQ(r.content, text);
    // a call longer than TOOLCALL_MAX_CALL_BYTES is content, however it is split;
    // one just under the limit is a call
    static char big[2 * TOOLCALL_MAX_CALL_BYTES];
    static size_t cuts[2 * TOOLCALL_MAX_CALL_BYTES];
    static result big1, big2;
    for (int over = 0; over < 2; over++) {
        const char *head = "<tool_call>{\"name\": \"w\", \"arguments\": {\"s\": \"";
        const char *tail = "\"}}</tool_call> after";
        size_t fill = TOOLCALL_MAX_CALL_BYTES - strlen(head) - strlen(tail) + strlen(" after") +
                      (over ? 100 : 0);
        n = (size_t)snprintf(big, sizeof big, "%s", head);
        memset(big + n, 'x', fill);
        n += fill;
        snprintf(big + n, sizeof big - n, "%s", tail);
        oneshot(&c, big, &big1);
        CHECK_EQ(big1.calls[0] != '\0', !over);
        if (over)
            CHECK_STR_EQ(big1.content, big);
        else
            CHECK_STR_EQ(big1.content, " after");
        int nc = 0; // token-like chunks of 1..8 bytes
        uint32_t x = 7;
        for (size_t at = 0;;) {
            x = x * 1103515245u + 12345u;
            at += 1 + (x >> 16) % 8;
            if (at >= strlen(big)) break;
            cuts[nc++] = at;
        }
        feed(&c, big, cuts, nc, &big2);
        same(&big1, &big2, "(big call)", "chunks");
    }
}

// ----------------------------------------------------------------------------
// Detection on the shared templates

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    CHECK(s && fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void test_detect(void) {
    CHECK_EQ(toolcall_format_detect(NULL), TOOLCALL_NONE);
    CHECK_EQ(toolcall_format_detect("{{ messages }}"), TOOLCALL_NONE);
    toolcall_format f;
    for (int i = 0; i < TOOLCALL__COUNT; i++) {
        CHECK(toolcall_format_parse(toolcall_format_name((toolcall_format)i), &f));
        CHECK_EQ(f, i);
    }
    CHECK(toolcall_format_parse("deepseek-v3.1", &f) && f == TOOLCALL_DEEPSEEK);
    CHECK(!toolcall_format_parse("nope", &f));
    int o;
    CHECK(server_tool_call_format_parse("auto", &o) && o == -1);
    CHECK(server_tool_call_format_parse("glm45", &o) && o == TOOLCALL_GLM45);

    const char *shared = getenv("KS_SHARED");
    static const struct {
        const char *file;
        toolcall_format f;
        const char *think; /* open marker, or NULL */
    } want[] = {
        {"Qwen-Qwen3-0.6B.jinja", TOOLCALL_HERMES, "<think>"},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", TOOLCALL_HERMES, NULL},
        {"Qwen-QwQ-32B.jinja", TOOLCALL_HERMES, "<think>"},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", TOOLCALL_HERMES, NULL},
        {"Qwen3-Coder.jinja", TOOLCALL_QWEN3_CODER, NULL},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", TOOLCALL_LLAMA3, NULL},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", TOOLCALL_LLAMA3, NULL},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOLCALL_MISTRAL, NULL},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", TOOLCALL_MISTRAL, NULL},
        {"GLM-4.6.jinja", TOOLCALL_GLM45, "<think>"},
        {"llama-cpp-deepseek-r1.jinja", TOOLCALL_DEEPSEEK, "<think>"},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TOOLCALL_DEEPSEEK, "<think>"},
        {"deepseek-ai-DeepSeek-V3.2.jinja", TOOLCALL_DSML, "<think>"},
        {"deepseek-ai-DeepSeek-V4.jinja", TOOLCALL_DSML, "<think>"},
        {"moonshotai-Kimi-K2.jinja", TOOLCALL_KIMI_K2, NULL},
        {"ByteDance-Seed-OSS.jinja", TOOLCALL_SEED_OSS, "<seed:think>"},
        {"NVIDIA-Nemotron-Nano-v2.jinja", TOOLCALL_NEMOTRON, "<think>"},
        {"unsloth-Apriel-1.5.jinja", TOOLCALL_APRIEL, NULL},
        {"ibm-granite-granite-3.3-2B-Instruct.jinja", TOOLCALL_GRANITE, "<think>"},
        {"ibm-granite-granite-4.0.jinja", TOOLCALL_HERMES, NULL},
        {"fireworks-ai-llama-3-firefunction-v2.jinja", TOOLCALL_FIREFUNCTION, NULL},
        {"google-gemma-2-2b-it.jinja", TOOLCALL_NONE, NULL},
        {"google-gemma-4-31B-it-interleaved.jinja", TOOLCALL_GEMMA4, "<|channel>thought\n"},
    };
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/README.md", shared ? shared : "");
    FILE *probe = shared ? fopen(path, "r") : NULL;
    if (!probe) {
        printf("note: ../shared/templates is absent: template detection not checked\n");
        return;
    }
    fclose(probe);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        snprintf(path, sizeof path, "%s/templates/%s", shared, want[i].file);
        char *src = slurp(path);
        CHECK(src);
        if (toolcall_format_detect(src) != want[i].f) {
            fprintf(stderr, "%s: detected %s, want %s\n", want[i].file,
                    toolcall_format_name(toolcall_format_detect(src)),
                    toolcall_format_name(want[i].f));
            CHECK(!"template format");
        }
        const char *op, *cl;
        bool has = toolcall_think_detect(src, &op, &cl);
        CHECK_EQ(has, want[i].think != NULL);
        if (has) CHECK_STR_EQ(op, want[i].think);
        free(src);
    }
}

// ----------------------------------------------------------------------------
// The request fields

static void req_ok(const char *tail, toolcall_choice choice, bool parallel, bool has_tools) {
    static char body[70000];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]%s}", tail);
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (!srv_request_parse(SRV_ROUTE_CHAT, body, strlen(body), &r, &e)) {
        fprintf(stderr, "refused: %s: %s\n", body, e.msg);
        CHECK(!"valid tool fields refused");
    }
    CHECK_EQ(r.tc.choice, choice);
    CHECK_EQ(r.tc.parallel, parallel);
    CHECK_EQ(r.tc.tools != NULL, has_tools);
    srv_request_free(&r);
}

static void req_bad(const char *tail, const char *param, const char *code, const char *needle) {
    static char body[70000];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]%s}", tail);
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse(SRV_ROUTE_CHAT, body, strlen(body), &r, &e)) {
        fprintf(stderr, "accepted: %s\n", body);
        CHECK(!"bad tool fields accepted");
    }
    CHECK_EQ(e.status, 400);
    CHECK_STR_EQ(e.param, param);
    CHECK_STR_EQ(e.code, code);
    CHECK_STR_HAS(e.msg, needle);
}

#define TOOL                                                                                       \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"      \
    "\"object\"}}}"

static void test_request(void) {
    req_ok("", TOOLCALL_CHOICE_AUTO, true, false);
    req_ok(",\"tools\":[" TOOL "]", TOOLCALL_CHOICE_AUTO, true, true);
    req_ok(",\"tools\":[]", TOOLCALL_CHOICE_AUTO, true, false);
    req_ok(",\"tools\":null,\"tool_choice\":null,\"parallel_tool_calls\":null",
           TOOLCALL_CHOICE_AUTO, true, false);
    req_ok(",\"tools\":[" TOOL "],\"tool_choice\":\"none\",\"parallel_tool_calls\":false",
           TOOLCALL_CHOICE_NONE, false, true);
    req_ok(",\"tools\":[" TOOL "],\"tool_choice\":\"auto\"", TOOLCALL_CHOICE_AUTO, true, true);
    req_ok(",\"tool_choice\":\"none\"", TOOLCALL_CHOICE_NONE, true, false);
    const char *ip = "invalid_parameter";
    req_bad(",\"tools\":{}", "tools", ip, "must be an array");
    req_bad(",\"tools\":[1]", "tools[0]", ip, "\"type\": \"function\"");
    req_bad(",\"tools\":[{\"type\":\"function\"}]", "tools[0].function", ip, "object");
    req_bad(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]",
            "tools[0].function.name", ip, "64 letters");
    req_bad(",\"tools\":[" TOOL "," TOOL "]", "tools[1].function.name", ip, "defined twice");
    req_bad(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
            "tools[0].function.parameters", ip, "JSON Schema");
    req_bad(",\"tools\":[" TOOL "],\"tool_choice\":\"sometimes\"", "tool_choice", ip, "sometimes");
    req_bad(",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\"}", "tool_choice", ip,
            "must be");
    req_bad(",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
            "\"other\"}}",
            "tool_choice", ip, "not in 'tools'");
    req_bad(",\"tool_choice\":\"required\"", "tool_choice", ip, "needs a non-empty 'tools'");
    req_bad(",\"parallel_tool_calls\":1", "parallel_tool_calls", ip, "boolean");
    // enforced by the call grammar (the server's srv__tool_choice_grammar)
    req_ok(",\"tools\":[" TOOL "],\"tool_choice\":\"required\"", TOOLCALL_CHOICE_REQUIRED, true,
           true);
    req_ok(",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
           "\"get_weather\"}}",
           TOOLCALL_CHOICE_NAMED, true, true);
    // a lot of tools: bounded
    static char many[65536];
    size_t n = (size_t)snprintf(many, sizeof many, ",\"tools\":[");
    for (int i = 0; i <= TOOLCALL_MAX_TOOLS; i++)
        n += (size_t)snprintf(many + n, sizeof many - n,
                              "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
                              i ? "," : "", i);
    snprintf(many + n, sizeof many - n, "]");
    req_bad(many, "tools", ip, "at most");
}

/* True when grammar text g compiles and a matcher accepts all of text as
 * complete. */
static bool grammar_takes(const char *g, const char *text) {
    grammar *gr = NULL;
    grammar_matcher *m = NULL;
    ks_errbuf eb;
    if (grammar_parse(g, strlen(g), &gr, &eb) != KS_OK) {
        fprintf(stderr, "grammar does not compile: %s\n%s\n", eb.msg, g);
        return false;
    }
    CHECK_EQ(grammar_matcher_create(gr, &m, &eb), KS_OK);
    bool ok = grammar_matcher_accept(m, text, strlen(text)) && grammar_matcher_complete(m);
    grammar_matcher_destroy(m);
    grammar_unref(gr);
    return ok;
}

/* toolcall_grammar compiles for every format, and for a JSON-argument
 * format admits exactly the calls of the allowed tools whose arguments its
 * parameters schema accepts (a tool without one: any object). */
static void test_grammar(void) {
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]",
        0, NULL);
    CHECK(tools);
    for (int f = 1; f < TOOLCALL__COUNT; f++) {
        char *g = toolcall_grammar((toolcall_format)f, tools, NULL);
        CHECK(g);
        grammar *gr = NULL;
        ks_errbuf eb;
        CHECK_EQ(grammar_parse(g, strlen(g), &gr, &eb), KS_OK);
        grammar_unref(gr);
        free(g);
    }
    char *any = toolcall_grammar(TOOLCALL_HERMES, tools, NULL);
    char *now = toolcall_grammar(TOOLCALL_HERMES, tools, "now");
#define CALL(n, a) "<tool_call>\n{\"name\": \"" n "\", \"arguments\": " a "}\n</tool_call>"
    CHECK(grammar_takes(any, CALL("get_weather", "{\"city\":\"Paris\"}")));
    CHECK(grammar_takes(any, CALL("now", "{\"x\": [1, \"y\"]}")));
    CHECK(!grammar_takes(any, CALL("get_weather", "{}")));                       // city is required
    CHECK(!grammar_takes(any, CALL("get_weather", "{\"city\":1}")));             // and a string
    CHECK(!grammar_takes(any, CALL("get_weather", "{\"city\":\"P\",\"d\":1}"))); // nothing else
    CHECK(!grammar_takes(any, CALL("other", "{}")));
    CHECK(grammar_takes(now, CALL("now", "{}")));
    CHECK(!grammar_takes(now, CALL("get_weather", "{\"city\":\"Paris\"}")));
#undef CALL
    free(any);
    free(now);
    CHECK(toolcall_grammar(TOOLCALL_NONE, tools, NULL) == NULL);
    CHECK(toolcall_grammar(TOOLCALL_HERMES, tools, "absent") == NULL);
    // every format: its grammar for "now" admits the format's own call text
    // (written here, not taken from toolcall.c), which its parser reads back
    static const char *const now_call[TOOLCALL__COUNT] = {
        [TOOLCALL_HERMES] = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        [TOOLCALL_QWEN3_CODER] = "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        [TOOLCALL_LLAMA3] = "{\"name\": \"now\", \"parameters\": {}}",
        [TOOLCALL_MISTRAL] = "[TOOL_CALLS]now[ARGS]{}",
        [TOOLCALL_GLM45] = "<tool_call>now\n</tool_call>",
        [TOOLCALL_DEEPSEEK] = B CB "function" SEP "now\n```json\n{}\n```" CE E,
        [TOOLCALL_DSML] = D "function_calls>\n" D "invoke name=\"now\">\n</" DT "invoke>\n</" DT
                            "function_calls>",
        [TOOLCALL_KIMI_K2] = "<|tool_calls_section_begin|><|tool_call_begin|>functions.now:0"
                             "<|tool_call_argument_begin|>{}<|tool_call_end|>"
                             "<|tool_calls_section_end|>",
        [TOOLCALL_NEMOTRON] = "<TOOLCALL>[{\"name\": \"now\", \"arguments\": {}}]</TOOLCALL>",
        [TOOLCALL_APRIEL] = "<tool_calls>[{\"name\": \"now\", \"arguments\": {}}]</tool_calls>",
        [TOOLCALL_GRANITE] = "<|tool_call|>[{\"name\": \"now\", \"arguments\": {}}]",
        [TOOLCALL_FIREFUNCTION] = " functools[{\"name\": \"now\", \"arguments\": {}}]",
        [TOOLCALL_SEED_OSS] = "<seed:tool_call>\n<function=now>\n</function>\n</seed:tool_call>",
        [TOOLCALL_HARMONY] = "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}",
        [TOOLCALL_GEMMA4] = "<|tool_call>call:now{}<tool_call|>",
    };
    for (int f = 1; f < TOOLCALL__COUNT; f++) {
        char *g = toolcall_grammar((toolcall_format)f, tools, "now");
        CHECK(g && now_call[f]);
        if (!grammar_takes(g, now_call[f]))
            fprintf(stderr, "%s: grammar\n%s\ndoes not take\n%s\n",
                    toolcall_format_name((toolcall_format)f), g, now_call[f]);
        CHECK(grammar_takes(g, now_call[f]));
        free(g);
        toolcall_cfg c = cfg_of((toolcall_format)f);
        result r;
        oneshot(&c, now_call[f], &r);
        CHECK_STR_EQ(r.calls, "now {}\n");
    }
    json_decref(tools);
}

int main(void) {
    CHECK(sodium_init() >= 0);
    test_hermes();
    test_qwen3_coder();
    test_llama3();
    test_mistral();
    test_glm();
    test_deepseek();
    test_dsml();
    test_kimi();
    test_json_lists();
    test_reasoning();
    test_harmony();
    test_harmony_calls();
    test_gemma4();
    test_limits();
    test_detect();
    test_request();
    test_grammar();
    printf("toolcall ok\n");
    return 0;
}
