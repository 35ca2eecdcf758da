/* cmd_template.c — `kvseal template`: renders a Jinja template with the
 * engine the server uses (src/jinja/), for checking a chat template and for
 * the jinja2 oracle test (tests/e2e/test_template_oracle.sh). The context
 * is a JSON object whose keys become the template's variables, passed as is
 * (no bos_token or messages are added). The output goes to stdout, byte for
 * byte, with no newline added; an error goes to stderr with exit status 1. */
#include "kvseal/cli.h"
#include "kvseal/gguf.h"
#include "kvseal/jinja.h"

#include "cli_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void template__usage(void) {
    fprintf(stderr, "usage: kvseal template (--file TEMPLATE | -m MODEL) [--context JSON |\n"
                    "                        --context-file FILE] [--now EPOCH]\n"
                    "  --file F          the template text (e.g. a chat template)\n"
                    "  -m MODEL          a GGUF file: its tokenizer.chat_template\n"
                    "  --context JSON    a JSON object: the template's variables ({} default)\n"
                    "  --context-file F  the same, read from a file\n"
                    "  --now EPOCH       the clock strftime_now reads (UTC seconds)\n");
}

enum { TPO_FILE, TPO_MODEL, TPO_CONTEXT, TPO_CONTEXT_FILE, TPO_NOW, TPO__N };
static const cli__opt template__opts[TPO__N] = {
    [TPO_FILE] = {"file", 0, true, false},
    [TPO_MODEL] = {"model", 'm', true, false},
    [TPO_CONTEXT] = {"context", 0, true, false},
    [TPO_CONTEXT_FILE] = {"context-file", 0, true, false},
    [TPO_NOW] = {"now", 0, true, false},
};

typedef struct {
    const char *file, *model_path, *ctx_text, *ctx_file;
    long long now;
} template__cfg;

static int template__apply(void *ctx, int id, const char *v, bool reset) {
    template__cfg *c = ctx;
    (void)reset;
    switch (id) {
    case TPO_FILE:
        c->file = v;
        return 0;
    case TPO_MODEL:
        c->model_path = v;
        return 0;
    case TPO_CONTEXT:
        c->ctx_text = v;
        return 0;
    case TPO_CONTEXT_FILE:
        c->ctx_file = v;
        return 0;
    case TPO_NOW: {
        char *end;
        errno = 0;
        c->now = strtoll(v, &end, 10);
        if (!*v || *end || errno) {
            fprintf(stderr, "kvseal template: --now expects UTC seconds, got '%s'\n", v);
            return 2;
        }
        return 0;
    }
    }
    return 2;
}

static void template__usage_cmd(const char *cmd) {
    (void)cmd;
    template__usage();
}

int cli_template(int argc, char **argv) {
    template__cfg cf = {0};
    const cli__spec sp = {"template",          template__opts, TPO__N, template__apply,
                          template__usage_cmd, false,          false};
    int prc = cli__opts_parse(&sp, &cf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    const char *file = cf.file, *model_path = cf.model_path, *ctx_text = cf.ctx_text,
               *ctx_file = cf.ctx_file;
    long long now = cf.now;
    if (!file == !model_path) {
        template__usage();
        return 2;
    }
    char *src = NULL, *ctxbuf = NULL;
    size_t src_len = 0;
    gguf_file *gf = NULL;
    json_t *ctx = NULL;
    jinja_tmpl *t = NULL;
    char *out = NULL;
    size_t out_len = 0;
    int rc = 1;
    ks_errbuf eb = {0};
    if (file) {
        if (!(src = cli__read_file(file, &src_len))) goto done;
    } else {
        if (gguf_open(model_path, &gf, &eb)) {
            fprintf(stderr, "kvseal template: %s\n", eb.msg);
            goto done;
        }
        gguf_str s;
        if (!gguf_get(gf, "tokenizer.chat_template") ||
            gguf_get_str(gf, "tokenizer.chat_template", &s, &eb)) {
            fprintf(stderr, "kvseal template: %s has no tokenizer.chat_template\n", model_path);
            goto done;
        }
        src_len = (size_t)s.len;
        if (!(src = malloc(src_len + 1))) goto done;
        memcpy(src, s.ptr, src_len);
        src[src_len] = 0;
    }
    if (ctx_file) {
        size_t n;
        if (!(ctxbuf = cli__read_file(ctx_file, &n))) goto done;
        ctx_text = ctxbuf;
    }
    json_error_t je;
    ctx = json_loads(ctx_text ? ctx_text : "{}", 0, &je);
    if (!json_is_object(ctx)) {
        fprintf(stderr, "kvseal template: the context must be a JSON object (%s)\n", je.text);
        goto done;
    }
    if (jinja_compile(src, src_len, NULL, &t, &eb)) {
        fprintf(stderr, "kvseal template: %s: %s\n", file ? file : model_path, eb.msg);
        goto done;
    }
    jinja_opts o = {.now = (time_t)now};
    if (jinja_render(t, ctx, &o, &out, &out_len, &eb)) {
        fprintf(stderr, "kvseal template: %s: %s\n", file ? file : model_path, eb.msg);
        goto done;
    }
    fwrite(out, 1, out_len, stdout);
    rc = 0;
done:
    free(out);
    jinja_free(t);
    json_decref(ctx);
    free(ctxbuf);
    free(src);
    gguf_close(gf);
    return rc;
}
