/* main.c — subcommand dispatch for the `kvseal` binary. The subcommands
 * are declared in cli.h and live in the ks_cli library. */
#include "cli_int.h"
#include "kvseal/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cli__cmd;

static void cli__usage(const cli__cmd *cmds, size_t n) {
    fprintf(stderr, "usage: kvseal COMMAND [options]   (kvseal --version: version and build)\n\n"
                    "commands:\n");
    for (size_t i = 0; i < n; i++) fprintf(stderr, "  %-11s %s\n", cmds[i].name, cmds[i].help);
}

int cli_main(int argc, char **argv) {
    ks_log_init_env();
    const cli__cmd cmds[] = {
        {"run", cli_run, "generate text from a prompt (text to stdout)"},
        {"perplexity", cli_perplexity, "perplexity of a text file"},
        {"tokenize", cli_tokenize, "print the tokens of a text"},
        {"inspect", cli_inspect, "print a GGUF file's metadata and tensors"},
        {"mkmodel", cli_mkmodel, "write a deterministic random-weight GGUF model"},
        {"mklora", cli_mklora, "write a deterministic random LoRA adapter for a GGUF model"},
        {"bench", cli_bench, "prompt/generation speed against the memory roofline"},
        {"serve", cli_serve, "OpenAI-compatible HTTP server with tenants (see serve --help)"},
        {"check", cli_check, "print the KV pool sizing arithmetic and exit 0/1 (I8)"},
        {"router", cli_router, "HTTP front of a prefill/decode cluster (see serve --help)"},
        {"prefill", cli_prefill, "prefill worker of a cluster (see serve --help)"},
        {"decode", cli_decode, "decode worker of a cluster (see serve --help)"},
        {"pull", cli_pull, "download a GGUF model from Hugging Face (ORG/REPO[:QUANT])"},
        {"template", cli_template, "render a Jinja (chat) template with a JSON context"},
        {"version", NULL, "version, git describe, CPU features, kernels, build kind"},
    };
    size_t n = sizeof cmds / sizeof cmds[0];
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) {
        cli__version_print(stdout);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        cli__usage(cmds, n);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "kvseal: unknown command '%s'\n\n", argv[1]);
    cli__usage(cmds, n);
    return 2;
}
