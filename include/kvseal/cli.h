/* cli.h — the `kvseal` subcommands. Each cli_<cmd> parses its own argv
 * (argv[0] is the subcommand name), writes results to stdout and diagnostics
 * to stderr, and returns a process exit status (0 ok, 1 failure, 2 usage). */
#ifndef KS_CLI_H
#define KS_CLI_H

/* Dispatches argv[1] to a subcommand; prints usage on an unknown one. */
int cli_main(int argc, char **argv);

int cli_inspect(int argc, char **argv);    /* kvseal inspect MODEL */
int cli_tokenize(int argc, char **argv);   /* kvseal tokenize -m MODEL [--ids] TEXT */
int cli_run(int argc, char **argv);        /* kvseal run -m MODEL -p PROMPT ... */
int cli_perplexity(int argc, char **argv); /* kvseal perplexity -m MODEL -f FILE [-c CTX] */
int cli_mkmodel(int argc, char **argv);    /* kvseal mkmodel ... */
int cli_mklora(int argc, char **argv);     /* kvseal mklora ... */
int cli_bench(int argc, char **argv);      /* kvseal bench -m MODEL */
int cli_serve(int argc, char **argv);      /* kvseal serve [-m MODEL] [--port N] ... */
int cli_check(int argc, char **argv);      /* kvseal check: KV pool sizing (I8) */
int cli_router(int argc, char **argv);     /* kvseal router: HTTP front of a cluster */
int cli_prefill(int argc, char **argv);    /* kvseal prefill: a prefill worker */
int cli_decode(int argc, char **argv);     /* kvseal decode: a decode worker */
int cli_template(int argc, char **argv);   /* kvseal template --file F --context JSON */
int cli_pull(int argc, char **argv);       /* kvseal pull ORG/REPO[:QUANT]: download a GGUF */

/* Path of the model shipped with kvseal (models/kjv-mini.gguf in the source
 * tree, or $KS_MODEL); static storage. */
const char *cli_default_model(void);

#endif /* KS_CLI_H */
