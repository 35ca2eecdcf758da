/* cmd_inspect.c — `kvseal inspect MODEL`: validate a GGUF file and print its
 * header, metadata and tensor table (gguf_print) to stdout, then whether
 * kvseal can run it ("runs: yes", or "runs: no: " and the loader's one-line
 * reason: architecture, tensor type, ...). A file that fails validation
 * prints the reader's message to stderr and exits 1. */
#include "cli_int.h"
#include "kvseal/gguf.h"
#include "kvseal/model.h"

#include <stdio.h>
#include <string.h>

static void inspect__usage(const char *cmd) {
    (void)cmd;
    fprintf(stderr, "usage: kvseal inspect MODEL.gguf\n");
}

static int inspect__apply(void *ctx, int id, const char *v, bool reset) {
    (void)ctx, (void)id, (void)v, (void)reset;
    return 2; // no options of its own
}

int cli_inspect(int argc, char **argv) {
    const cli__spec sp = {"inspect", NULL, 0, inspect__apply, inspect__usage, false, true};
    int first = argc;
    int prc = cli__opts_parse(&sp, NULL, argc, argv, &first);
    if (prc) return prc < 0 ? 0 : prc;
    if (argc - first != 1) {
        inspect__usage("inspect");
        return 2;
    }
    const char *path = argv[first];
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *f;
    ks_err e = gguf_open(path, &f, &eb);
    if (e) {
        fprintf(stderr, "kvseal inspect: %s (%s)\n", eb.msg, ks_err_name(e));
        return 1;
    }
    gguf_print(f, stdout);
    gguf_close(f);
    e = model_check(path, &eb);
    if (e)
        printf("runs: no: %s (%s)\n", eb.msg, ks_err_name(e));
    else
        printf("runs: yes\n");
    if (fflush(stdout) != 0) return 1;
    return 0;
}
