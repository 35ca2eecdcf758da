/* fuzz_jinja.c — libFuzzer harness for the Jinja template engine
 * (src/jinja/): a GGUF file's tokenizer.chat_template is untrusted input.
 *
 * Each input is a template (any bytes). It is compiled with tight limits and,
 * when it compiles, rendered against a fixed chat context (messages with a
 * tool call, tools, add_generation_prompt, bos/eos) twice, the second time
 * with the context as request data (jinja_render_marked): the output must
 * be the same both times (a render is a pure function of template and
 * context, and marks never change the text; the marked render may only
 * stop earlier, on a limit, as marks cost steps), its spans sorted,
 * disjoint, non-empty and inside the output, and no render may take more
 * than the step, memory or output limits allow (libFuzzer's -timeout and
 * -rss_limit_mb catch one that does). Built only with KS_FUZZ=ON; see
 * tests/fuzz/README.md. */
#include "kvseal/jinja.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *fz__ctx;

static json_t *fz__context(void) {
    if (fz__ctx) return fz__ctx;
    const char *ctx =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Hi \\u00fc <x> \\\"q\\\"\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\","
        " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5,"
        " true, null]}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
        " {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
    fz__ctx = json_loads(ctx, 0, NULL);
    return fz__ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jinja_limits lim = {
        .max_src_bytes = 1 << 16,
        .max_depth = 64,
        .max_calls = 16,
        .max_steps = 200000,
        .max_out_bytes = 1 << 20,
        .max_mem_bytes = 64 << 20,
    };
    jinja_tmpl *t = NULL;
    if (jinja_compile((const char *)data, size, &lim, &t, NULL) != KS_OK) return 0;
    jinja_opts o = {.now = 1764633600};
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ks_err ea = jinja_render(t, fz__context(), &o, &a, &na, NULL);
    jinja_opts od = {.now = o.now, .data = fz__context()};
    jinja_span *sp = NULL;
    size_t n_sp = 0;
    ks_errbuf ebuf = {0};
    ks_err eb = jinja_render_marked(t, NULL, &od, &b, &nb, &sp, &n_sp, &ebuf);
    if (ea == KS_OK && eb != KS_OK && !strstr(ebuf.msg, "template limit")) abort();
    if (ea != KS_OK && eb == KS_OK) abort();
    if (ea == KS_OK && eb == KS_OK) {
        if (na != nb || memcmp(a, b, na) != 0 || na > lim.max_out_bytes) abort();
        for (size_t i = 0, end = 0; i < n_sp; i++) {
            if (sp[i].len == 0 || sp[i].off < end || (i && sp[i].off == end)) abort();
            end = sp[i].off + sp[i].len;
            if (end > nb) abort();
        }
    }
    free(a);
    free(b);
    free(sp);
    jinja_free(t);
    return 0;
}
