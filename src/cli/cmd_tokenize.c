/* cmd_tokenize.c — `kvseal tokenize`: prints the tokens of a text, one
 * "id 'piece'" line per token (piece escaped: \n \t \r \\ \' and \xNN for
 * other control bytes and invalid UTF-8), or with --ids only the ids on one
 * line. BOS/EOS are added as the model's metadata says unless --no-bos;
 * special-token text is parsed only with --special. */
#include "cli_int.h"
#include "kvseal/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tokenize__usage(void) {
    fprintf(stderr,
            "usage: kvseal tokenize [-m MODEL] [--ids] [--no-bos] [--special] TEXT...\n"
            "  -m MODEL    GGUF file (default: %s)\n"
            "  --ids       print only the ids, space-separated, on one line\n"
            "  --no-bos    do not add BOS/EOS\n"
            "  --special   parse special-token text such as <s>\n"
            "  TEXT...     words are joined with single spaces\n",
            cli_default_model());
}

/* Length of the valid UTF-8 sequence at p[0..n), or 0 if invalid. */
static size_t tokenize__utf8_ok(const unsigned char *p, size_t n) {
    size_t l = p[0] >= 0xF5 ? 0 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (l == 0 || l > n) return 0;
    for (size_t k = 1; k < l; k++)
        if ((p[k] & 0xC0) != 0x80) return 0;
    return l;
}

static void tokenize__print_escaped(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t l;
        if (c == '\n')
            fputs("\\n", stdout), i++;
        else if (c == '\t')
            fputs("\\t", stdout), i++;
        else if (c == '\r')
            fputs("\\r", stdout), i++;
        else if (c == '\\')
            fputs("\\\\", stdout), i++;
        else if (c == '\'')
            fputs("\\'", stdout), i++;
        else if (c >= 0x20 && c < 0x7F)
            putchar(c), i++;
        else if (c >= 0x80 && (l = tokenize__utf8_ok(p + i, n - i)) > 0)
            fwrite(p + i, 1, l, stdout), i += l;
        else
            printf("\\x%02x", c), i++;
    }
}

enum { TO_MODEL, TO_IDS, TO_NO_BOS, TO_SPECIAL, TO__N };
static const cli__opt tokenize__opts[TO__N] = {
    [TO_MODEL] = {"model", 'm', true, false},
    [TO_IDS] = {"ids", 0, false, false},
    [TO_NO_BOS] = {"no-bos", 0, false, false},
    [TO_SPECIAL] = {"special", 0, false, false},
};

typedef struct {
    const char *model;
    bool ids_only, add_special, parse_special;
} tokenize__cfg;

static int tokenize__apply(void *ctx, int id, const char *v, bool reset) {
    tokenize__cfg *c = ctx;
    (void)reset;
    bool on = !strcmp(v, "true");
    switch (id) {
    case TO_MODEL:
        c->model = v;
        break;
    case TO_IDS:
        c->ids_only = on;
        break;
    case TO_NO_BOS:
        c->add_special = !on;
        break;
    case TO_SPECIAL:
        c->parse_special = on;
        break;
    }
    return 0;
}

static void tokenize__usage_cmd(const char *cmd) {
    (void)cmd;
    tokenize__usage();
}

int cli_tokenize(int argc, char **argv) {
    tokenize__cfg cf = {.add_special = true};
    const cli__spec sp = {"tokenize",          tokenize__opts, TO__N, tokenize__apply,
                          tokenize__usage_cmd, false,          true};
    int first_text = argc;
    int prc = cli__opts_parse(&sp, &cf, argc, argv, &first_text);
    if (prc) return prc < 0 ? 0 : prc;
    const char *model_path = cf.model;
    bool ids_only = cf.ids_only, add_special = cf.add_special, parse_special = cf.parse_special;
    size_t text_cap = 1, text_len = 0;
    if (first_text >= argc) {
        tokenize__usage();
        return 2;
    }
    for (int i = first_text; i < argc; i++)
        text_cap += strlen(argv[i]) + 1;
    char *text = malloc(text_cap);
    if (!text) {
        fprintf(stderr, "kvseal tokenize: out of memory\n");
        return 1;
    }
    for (int i = first_text; i < argc; i++) {
        if (i > first_text) text[text_len++] = ' ';
        size_t l = strlen(argv[i]);
        memcpy(text + text_len, argv[i], l);
        text_len += l;
    }
    text[text_len] = '\0';
    if (!model_path) model_path = cli_default_model();

    int rc = 1;
    ks_errbuf eb;
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *piece = NULL;
    if (gguf_open(model_path, &f, &eb) != KS_OK || tok_vocab_load(f, &v, &eb) != KS_OK ||
        tok_encode(v, text, text_len, add_special, parse_special, &ids, &n_ids, &eb) != KS_OK) {
        fprintf(stderr, "kvseal tokenize: %s\n", eb.msg);
        goto done;
    }
    gguf_close(f);
    f = NULL;
    if (ids_only) {
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    } else {
        size_t cap = tok_max_piece(v);
        piece = malloc(cap);
        if (!piece) {
            fprintf(stderr, "kvseal tokenize: out of memory\n");
            goto done;
        }
        for (size_t i = 0; i < n_ids; i++) {
            size_t pn = tok_piece(v, ids[i], true, piece, cap);
            printf("%d '", ids[i]);
            tokenize__print_escaped(piece, pn < cap ? pn : cap);
            fputs("'\n", stdout);
        }
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    free(piece);
    free(ids);
    tok_vocab_free(v);
    gguf_close(f);
    free(text);
    return rc;
}
