/* fuzz_json.c — libFuzzer harness for the HTTP API's request parser
 * (srv_request_parse, src/server/api.c).
 *
 * Each input is one request body, parsed as all three generation routes
 * (chat, completions, Workers AI) and as Anthropic's Messages API
 * (srv_anth_parse, src/server/anthropic.c: the body translated into a chat
 * request, which must then parse as one or fail with an error). A parse that succeeds must have
 * produced a request the server can use: its chat messages are rendered with every template family
 * (src/tok/chat.c) and, as the template-facing JSON (tools, tool calls, kwargs), through a Jinja
 * chat template that walks every field (srv_chat_render, as the server does next). A parse that
 * fails must have produced an error the server can answer with
 * (srv_error_json must not fail), and so must the 404 for an unknown model,
 * which quotes the model name: from the body (a parsed request's model) or
 * from the URL (the raw input, any bytes). Built only with KS_FUZZ=ON; see
 * tests/fuzz/README.md. */
#include "server/server_int.h"

#include "kvseal/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fz__render(const srv_request *r) {
    for (int fam = CHAT_PLAIN; fam <= CHAT_GEMMA; fam++) {
        char *out = NULL;
        ks_errbuf eb;
        ks_err e = chat_render_family((chat_family)fam, NULL, r->msgs, r->n_msgs, true, &out, &eb);
        if (e == KS_OK && !out) abort();
        if (e != KS_OK && out) abort();
        free(out);
    }
}

/* A template that touches what a request can hand a template. */
static const char fz__tmpl_src[] =
    "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content if m.content is string }}"
    "{% for tc in m.tool_calls | default([]) %}{{ tc.function.name }}{{ tc.function.arguments "
    "| tojson }}{% endfor %}{{ m.tool_call_id }}{{ m.name }}{{ m.reasoning_content }}"
    "{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    "{{ enable_thinking is defined }}{{ add_generation_prompt }}";

static void fz__render_tmpl(const srv_request *r) {
    static chat_tmpl *t;
    if (!t && chat_tmpl_from_text(fz__tmpl_src, sizeof fz__tmpl_src - 1, "fuzz", NULL, &t, NULL))
        abort();
    char *out = NULL;
    bool add_special;
    srv_error err;
    ks_errbuf eb;
    tok_span *spans = NULL;
    size_t n_spans = 0;
    ks_err e = srv_chat_render(t, NULL, r, &out, &add_special, &spans, &n_spans, &err, &eb);
    free(spans);
    if (e == KS_OK && (!out || add_special)) abort();
    free(out);
}

/* The 404 the server answers for an unknown model (src/server/http.c). */
static void fz__not_found(srv_route route, const char *name) {
    srv_error err;
    srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
               "The model '%s' does not exist; this server serves '%s'", name, "kjv-mini");
    char *j = srv_error_json(route, &err);
    if (!j) abort(); /* only out-of-memory may fail */
    free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const srv_route routes[] = {SRV_ROUTE_CHAT, SRV_ROUTE_COMPLETIONS, SRV_ROUTE_WORKERS};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        srv_request r;
        srv_error err;
        memset(&r, 0, sizeof r);
        memset(&err, 0, sizeof err);
        if (srv_request_parse(routes[i], (const char *)data, size, &r, &err)) {
            if (r.route != routes[i]) abort();
            if (r.n_msgs > 0) fz__render(&r);
            if (r.tmpl_msgs) fz__render_tmpl(&r);
            /* every string the parser hands out must be readable */
            if (r.model) fz__not_found(routes[i], r.model);
            if (r.prompt) (void)strlen(r.prompt);
            for (int k = 0; k < r.n_stops; k++) (void)strlen(r.stops[k]);
        } else {
            if (err.status < 400 || err.status > 599) abort();
            char *j = srv_error_json(routes[i], &err);
            if (!j) abort();
            free(j);
        }
        srv_request_free(&r);
    }
    /* Anthropic's Messages: its translation, then the chat parser */
    {
        srv_request r;
        srv_error err;
        memset(&err, 0, sizeof err);
        if (srv_anth_parse((const char *)data, size, &r, &err)) {
            if (r.route != SRV_ROUTE_MESSAGES || !r.model || !r.n_msgs || r.max_tokens < 1) abort();
            if (r.tmpl_msgs) fz__render_tmpl(&r);
            fz__not_found(SRV_ROUTE_MESSAGES, r.model);
            srv_request_free(&r);
        } else {
            if (err.status < 400 || err.status > 599) abort();
            char *j = srv_error_json(SRV_ROUTE_MESSAGES, &err);
            if (!j) abort();
            free(j);
        }
    }
    /* the input as a model name from the URL (NUL ends it there too) */
    char *name = malloc(size + 1);
    if (!name) abort();
    memcpy(name, data, size);
    name[size] = '\0';
    fz__not_found(SRV_ROUTE_WORKERS, name);
    free(name);
    return 0;
}
