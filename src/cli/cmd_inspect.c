/* cmd_inspect.c — `kvseal inspect MODEL`: validate a GGUF file and print its
 * header, metadata and tensor table (gguf_print) to stdout, then whether
 * kvseal can run it ("runs: yes", or "runs: no: " and the loader's one-line
 * reason: architecture, tensor type, ...). A file that fails validation
 * prints the reader's message to stderr and exits 1. */
#include "kvseal/cli.h"
#include "kvseal/gguf.h"
#include "kvseal/model.h"

#include <stdio.h>
#include <string.h>

int cli_inspect(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: kvseal inspect MODEL.gguf\n");
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: kvseal inspect MODEL.gguf\n");
        return 2;
    }
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *f;
    ks_err e = gguf_open(argv[1], &f, &eb);
    if (e) {
        fprintf(stderr, "kvseal inspect: %s (%s)\n", eb.msg, ks_err_name(e));
        return 1;
    }
    gguf_print(f, stdout);
    gguf_close(f);
    e = model_check(argv[1], &eb);
    if (e)
        printf("runs: no: %s (%s)\n", eb.msg, ks_err_name(e));
    else
        printf("runs: yes\n");
    if (fflush(stdout) != 0) return 1;
    return 0;
}
