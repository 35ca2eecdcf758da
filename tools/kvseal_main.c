/* kvseal_main.c — the single `kvseal` binary: all logic is in the library
 * (src/cli dispatches the subcommands), so tests reach all of it. */
#include "kvseal/cli.h"

int main(int argc, char **argv) { return cli_main(argc, argv); }
