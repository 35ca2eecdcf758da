/* fuzz_toolcall.c — libFuzzer harness for the tool-call and reasoning parser
 * (src/server/toolcall.c), whose input is a model's output: any bytes.
 *
 * The first byte picks the format (mod the count), whether think markers
 * apply and whether the answer starts inside the block; the second seeds the
 * chunk sizes; the rest is the text. It is parsed at once and again fed in
 * chunks of 1..16 bytes: both must give the same content, reasoning and
 * calls (the streaming contract), every call's arguments must be a JSON
 * object and no byte may vanish beyond the documented whitespace. Built
 * only with KS_FUZZ=ON; see tests/fuzz/README.md. */
#include "server/server_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static toolcall_parser *fz__run(const toolcall_cfg *cfg, const char *s, size_t n, uint8_t seed) {
    toolcall_parser *p;
    if (toolcall_parser_create(cfg, &p)) abort();
    toolcall_delta d;
    size_t at = 0;
    uint32_t x = seed;
    while (at < n) {
        size_t k = n - at;
        if (seed) {
            x = x * 1103515245u + 12345u;
            size_t c = 1 + (x >> 16) % 16;
            if (c < k) k = c;
        }
        if (toolcall_parser_push(p, s + at, k, &d)) abort();
        at += k;
    }
    if (toolcall_parser_finish(p, &d)) abort();
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    toolcall_cfg cfg = {.format = (toolcall_format)(data[0] % TOOLCALL__COUNT)};
    if (data[0] & 0x40) cfg.think_open = "<think>", cfg.think_close = "</think>";
    cfg.in_reasoning = (data[0] & 0x80) != 0;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    toolcall_parser *a = fz__run(&cfg, s, n, 0), *b = fz__run(&cfg, s, n, data[1] | 1);
    size_t al, bl, ar, br;
    const char *ac = toolcall_parser_content(a, &al), *bc = toolcall_parser_content(b, &bl);
    const char *ars = toolcall_parser_reasoning(a, &ar), *brs = toolcall_parser_reasoning(b, &br);
    if (al != bl || memcmp(ac, bc, al) || ar != br || memcmp(ars, brs, ar)) abort();
    int nc = toolcall_parser_n_calls(a);
    if (nc != toolcall_parser_n_calls(b) || nc > TOOLCALL_MAX_CALLS) abort();
    for (int i = 0; i < nc; i++) {
        const toolcall_call *x = toolcall_parser_call(a, i), *y = toolcall_parser_call(b, i);
        if (strcmp(x->name, y->name) || strcmp(x->arguments, y->arguments)) abort();
        json_t *j = json_loads(x->arguments, JSON_ALLOW_NUL, NULL); // "\u0000" is JSON
        if (!json_is_object(j)) abort();
        json_decref(j);
    }
    // without markers of any kind, the text is the content, byte for byte
    if (cfg.format == TOOLCALL_NONE && !cfg.think_open && (al != n || memcmp(ac, s, n))) abort();
    toolcall_parser_destroy(a);
    toolcall_parser_destroy(b);
    return 0;
}
