/* test_server_tools.c — chat answers with tool calls and reasoning through
 * the HTTP front (src/server/http.c + toolcall.c) over real sockets, on a
 * scripted server_backend whose "model" writes a given text in small pieces
 * (kjv-mini never writes a call, so tests/e2e/test_serve_tools.sh cannot
 * reach this path until a grammar forces one):
 * - message.tool_calls (call_ ids, names, compact JSON arguments), content
 *   null when nothing else was said, reasoning_content, finish_reason
 *   "tool_calls" (a length finish stays "length");
 * - streamed: delta.tool_calls with index, id, type and name first, then the
 *   arguments; the stream adds up to exactly the non-streamed answer;
 * - parallel_tool_calls false keeps one call; tool_choice "none" and no
 *   tools leave calls as content; a malformed call stays content.
 * Needs models/kjv-mini.gguf (tokenizer) via KS_SRC. */
#include "../check.h"
#include "kvseal/server.h"
#include "server/toolcall.h"
#include "server_fixture.h"

#include <jansson.h>

// ----------------------------------------------------------------------------
// The scripted backend: the user message "t<k>" picks text k

enum { T_CALL, T_TWO, T_LENGTH, T_BAD, T__N };

static const char *const TEXTS[T__N] = {
    [T_CALL] = "<think>plan</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
               "{\"city\": \"Paris\"}}\n</tool_call>",
    [T_TWO] =
        "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
        "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
        "{}}\n</tool_call>",
    [T_LENGTH] = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
    [T_BAD] = "<tool_call>{\"name\": \"get_time\", \"arguments\": [}</tool_call>",
};

static const model *g_model;

typedef struct fake_req {
    int k, next, n_events;
} fake_req;

#define PIECE 3 /* bytes per "token" */

static ks_err fake_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    (void)impl, (void)eb;
    fake_req *r = calloc(1, sizeof *r);
    CHECK(r);
    r->k = sfx_prompt_number(g_model, p);
    CHECK(r->k >= 0 && r->k < T__N);
    r->n_events = (int)((strlen(TEXTS[r->k]) + PIECE - 1) / PIECE);
    *req = r;
    return KS_OK;
}

static ks_err fake_next(void *req, engine_event *ev, uint32_t timeout_ms) {
    (void)timeout_ms;
    fake_req *r = req;
    if (r->next > r->n_events) return KS_ERR_CANCELLED;
    memset(ev, 0, sizeof *ev);
    ev->n_prompt = 2;
    const char *t = TEXTS[r->k];
    if (r->next < r->n_events) {
        size_t at = (size_t)r->next * PIECE, n = strlen(t) - at;
        if (n > PIECE) n = PIECE;
        memcpy(ev->text, t + at, n);
        ev->text_len = n;
        ev->token = 100; // a plain text token: no special-token text is added
    } else {
        ev->done = true;
        ev->token = -1;
        ev->state = ENGINE_FINISHED;
        ev->finish = r->k == T_LENGTH ? ENGINE_FINISH_LENGTH : ENGINE_FINISH_STOP;
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

// ----------------------------------------------------------------------------
// A minimal HTTP client

static char g_raw[1 << 18];

/* POSTs body to /v1/chat/completions; returns the status, *body the body. */
static int chat(int port, const char *body, const char **out) {
    return sfx_http(port, "POST", "/v1/chat/completions", NULL, body, g_raw, sizeof g_raw, out);
}

#define TOOLS                                                                                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"    \
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},{\"type\":"            \
    "\"function\","                                                                                \
    "\"function\":{\"name\":\"get_time\"}}]"

/* The answer to text k's request with extra fields, as one message object
 * {content, reasoning_content, tool_calls: [{id, type, function}], finish}:
 * non-streamed as it comes; streamed, the chunks added up the way clients
 * do (by tool call index). A new reference. */
static json_t *answer(int port, int k, const char *extra, bool stream) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"kjv\",\"messages\":[{\"role\":\"user\",\"content\":\"t%d\"}],"
             "\"max_tokens\":64%s%s,\"stream\":%s}",
             k, extra[0] ? "," : "", extra, stream ? "true" : "false");
    const char *b;
    int status = chat(port, body, &b);
    if (status != 200) fprintf(stderr, "%s\n", g_raw);
    CHECK_EQ(status, 200);
    if (!stream) {
        json_t *j = json_loads(b, 0, NULL);
        CHECK(j);
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *m = json_deep_copy(json_object_get(c0, "message"));
        json_object_set(m, "finish", json_object_get(c0, "finish_reason"));
        json_decref(j);
        return m;
    }
    // streamed: add the deltas up
    json_t *m = json_pack("{s:s, s:s, s:[]}", "content", "", "reasoning_content", "", "tool_calls");
    json_t *calls = json_object_get(m, "tool_calls");
    int n_chunks = 0;
    for (const char *p = b; (p = strstr(p, "data: ")); p++) {
        p += 6;
        if (!strncmp(p, "[DONE]", 6)) break;
        const char *e = strstr(p, "\n\n");
        CHECK(e);
        json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
        CHECK(j);
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d = json_object_get(c0, "delta"), *v;
        if (json_is_string(json_object_get(c0, "finish_reason")))
            json_object_set(m, "finish", json_object_get(c0, "finish_reason"));
        const char *fields[] = {"content", "reasoning_content"};
        for (int f = 0; f < 2; f++) {
            if (!json_is_string(v = json_object_get(d, fields[f]))) continue;
            char *cat = NULL;
            CHECK(asprintf(&cat, "%s%s", json_string_value(json_object_get(m, fields[f])),
                           json_string_value(v)) >= 0);
            json_object_set_new(m, fields[f], json_string(cat));
            free(cat);
        }
        size_t i;
        json_t *tc;
        json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
            int idx = (int)json_integer_value(json_object_get(tc, "index"));
            json_t *fn = json_object_get(tc, "function");
            if ((size_t)idx == json_array_size(calls)) { // a new call: id, type, name come first
                CHECK(json_is_string(json_object_get(tc, "id")));
                CHECK(json_is_string(json_object_get(fn, "name")));
                json_array_append_new(
                    calls, json_pack("{s:O, s:O, s:{s:O, s:s}}", "id", json_object_get(tc, "id"),
                                     "type", json_object_get(tc, "type"), "function", "name",
                                     json_object_get(fn, "name"), "arguments", ""));
            }
            CHECK((size_t)idx < json_array_size(calls));
            json_t *have = json_object_get(
                json_object_get(json_array_get(calls, (size_t)idx), "function"), "arguments");
            json_t *frag = json_object_get(fn, "arguments");
            if (json_is_string(frag)) {
                char *cat = NULL;
                CHECK(asprintf(&cat, "%s%s", json_string_value(have), json_string_value(frag)) >=
                      0);
                json_string_set(have, cat);
                free(cat);
            }
        }
        json_decref(j);
        n_chunks++;
    }
    CHECK(n_chunks > 2);
    // the non-streamed shape: empty fields absent, content null beside calls
    if (!json_array_size(calls)) json_object_del(m, "tool_calls");
    if (!json_string_length(json_object_get(m, "reasoning_content")))
        json_object_del(m, "reasoning_content");
    return m;
}

static const char *str(const json_t *m, const char *key) {
    return json_string_value(json_object_get(m, key));
}

/* Checks m against content (NULL: JSON null), reasoning (NULL: absent),
 * calls ("name args\n" each, NULL: none) and the finish reason. */
static void expect_msg(json_t *m, const char *content, const char *reasoning, const char *calls,
                       const char *finish) {
    char *dump = json_dumps(m, JSON_COMPACT);
    fprintf(stderr, "  %s\n", dump);
    free(dump);
    if (content)
        CHECK_STR_EQ(str(m, "content"), content);
    else
        CHECK(json_is_null(json_object_get(m, "content")));
    if (reasoning)
        CHECK_STR_EQ(str(m, "reasoning_content"), reasoning);
    else
        CHECK(!json_object_get(m, "reasoning_content"));
    char got[1024] = "";
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        json_t *fn = json_object_get(tc, "function");
        CHECK_STR_EQ(str(tc, "type"), "function");
        CHECK(!strncmp(str(tc, "id"), "call_", 5) && strlen(str(tc, "id")) == 29);
        size_t l = strlen(got);
        snprintf(got + l, sizeof got - l, "%s %s\n", str(fn, "name"), str(fn, "arguments"));
    }
    CHECK_STR_EQ(got, calls ? calls : "");
    CHECK(!calls == !json_object_get(m, "tool_calls"));
    CHECK_STR_EQ(str(m, "finish"), finish);
}

/* Non-streamed and streamed answers agree (ids aside) and match. */
static void expect_both(int port, int k, const char *extra, const char *content,
                        const char *reasoning, const char *calls, const char *finish) {
    for (int stream = 0; stream < 2; stream++) {
        fprintf(stderr, "text %d, %s, %s:\n", k, extra, stream ? "streamed" : "not streamed");
        json_t *m = answer(port, k, extra, stream);
        if (stream && !content) { // no content delta was sent
            CHECK_STR_EQ(str(m, "content"), "");
            json_object_set_new(m, "content", json_null());
        }
        expect_msg(m, content, reasoning, calls, finish);
        json_decref(m);
    }
}

int main(void) {
    model *m = kjv_model_load(false);
    if (!m) return 1;
    g_model = m;
    server_backend b = sfx_backend(NULL);
    server_opts o;
    sfx_opts(&o);
    o.tool_call_format = TOOLCALL_HERMES; // the template below does not tell
    // tools need a chat template (kjv-mini has none): a minimal one of our own
    char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/ks_test_tools_%d.jinja", (int)getpid());
    FILE *tf = fopen(tmpl, "w");
    CHECK(tf != NULL);
    fputs("{{- bos_token }}{% for m in messages %}User: {{ m.content }}\nAssistant:{% endfor %}",
          tf);
    fclose(tf);
    o.chat_template_file = tmpl;
    o.reasoning_format = 1; // deepseek: <think> ... </think>
    server *s;
    ks_errbuf eb;
    CHECK(server_create_backend(&o, &b, m, &s, &eb) == KS_OK);
    unlink(tmpl);
    int port = server_port(s);

    const char *weather = "get_weather {\"city\":\"Paris\"}\n";
    expect_both(port, T_CALL, TOOLS, NULL, "plan", weather, "tool_calls");
    expect_both(port, T_TWO, TOOLS, "Sure.\n\n", NULL,
                "get_weather {\"city\":\"Paris\",\"days\":2}\nget_time {}\n", "tool_calls");
    expect_both(port, T_TWO, TOOLS ",\"parallel_tool_calls\":false", "Sure.\n\n", NULL,
                "get_weather {\"city\":\"Paris\",\"days\":2}\n", "tool_calls");
    expect_both(port, T_LENGTH, TOOLS, NULL, NULL, "get_time {}\n", "length");
    // no tools, or tool_choice none: calls are content; reasoning is still split
    const char *call_text = TEXTS[T_CALL] + strlen("<think>plan</think>\n");
    expect_both(port, T_CALL, "", call_text, "plan", NULL, "stop");
    expect_both(port, T_CALL, TOOLS ",\"tool_choice\":\"none\"", call_text, "plan", NULL, "stop");
    // a malformed call stays content, byte for byte
    expect_both(port, T_BAD, TOOLS, TEXTS[T_BAD], NULL, NULL, "stop");
    server_destroy(s);
    model_free(m);
    printf("server tools ok\n");
    return 0;
}
