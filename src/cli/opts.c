/* opts.c — the option layer every subcommand parses through (cli_int.h):
 * GNU getopt_long over a table of the subcommand's options (--opt=value,
 * --opt value, -m value, -mvalue, `--` ends the options, unique prefixes of
 * long names), the logging options every subcommand takes (--log-format,
 * --log-level), and --config FILE for the server and cluster roles.
 *
 * A config file holds `key = value` lines whose keys are the long option
 * names (docs/operations.md "Options, logs and the config file"). It is applied first and
 * the command line after it, so a flag given on the command line wins; a
 * repeatable option (--alias) given on the command line replaces the file's
 * list rather than adding to it. Unknown keys, a key given twice (other than
 * a repeatable one such as alias), a missing '=' or a flag with a value
 * other than true/false are errors naming the file and line.
 *
 * Every option also has an environment variable, KVSEAL_ and its long name
 * upper-cased with '-' as '_' (--port: KVSEAL_PORT), derived here from the
 * table so that a new option gets one without more code. Precedence: the
 * command line, then the environment, then the config file, then the
 * default. A flag's variable takes 1, 0, true or false; a bad value is an
 * error naming the variable.
 *
 * Also `kvseal --version`: the version comes from CMake's project VERSION
 * through the generated kvseal_version.h, with git describe when the build
 * saw a git checkout. */
#include "cli_int.h"

#include "kvseal/kern.h"
#include "kvseal_version.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

// the options the layer owns, numbered after the subcommand's table
enum { OPT_HELP, OPT_CONFIG, OPT_LOG_FORMAT, OPT_LOG_LEVEL, OPT__N };
static const cli__opt opts__own[OPT__N] = {
    {"help", 'h', false, false},
    {"config", 0, true, false},
    {"log-format", 0, true, false},
    {"log-level", 0, true, false},
};

/* Applies a logging option; prints and returns false on a bad value. */
static bool opts__log(const char *cmd, int own, const char *v) {
    if (own == OPT_LOG_FORMAT) {
        ks_log_format f;
        if (!ks_log_format_parse(v, &f)) {
            fprintf(stderr, "kvseal %s: --log-format expects text or json, got '%s'\n", cmd, v);
            return false;
        }
        ks_log_set_format(f);
    } else {
        ks_log_level l;
        if (!ks_log_level_parse(v, &l)) {
            fprintf(stderr,
                    "kvseal %s: --log-level expects debug, info, warn, error or off, got '%s'\n",
                    cmd, v);
            return false;
        }
        ks_log_set_level(l);
    }
    return true;
}

/* The option spec's i-th entry: the subcommand's, then the layer's own. */
static const cli__opt *opts__at(const cli__spec *sp, int i) {
    return i < sp->n_opts ? &sp->opts[i] : &opts__own[i - sp->n_opts];
}

/* Strips leading and trailing blanks in place; returns the new start. */
static char *opts__trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* Applies one option from a config line (file:line for messages).
 * first_line[i] is the line that set option i (0: none yet): a key other
 * than a repeatable one given twice is an error, since one value would
 * silently win over the other. */
static int opts__apply_config(const cli__spec *sp, void *ctx, const char *path, int line,
                              const char *key, const char *val, int *first_line) {
    int n_all = sp->n_opts + OPT__N;
    for (int i = 0; i < n_all; i++) {
        const cli__opt *o = opts__at(sp, i);
        if (strcmp(o->name, key) != 0) continue;
        if (i - sp->n_opts == OPT_HELP || i - sp->n_opts == OPT_CONFIG) break;
        if (first_line[i] && !o->repeat) {
            fprintf(stderr, "kvseal %s: %s:%d: duplicate key '%s' (first set on line %d)\n",
                    sp->cmd, path, line, key, first_line[i]);
            return 2;
        }
        if (!first_line[i]) first_line[i] = line;
        if (!o->has_arg && strcmp(val, "true") != 0 && strcmp(val, "false") != 0) {
            fprintf(stderr,
                    "kvseal %s: %s:%d: '%s' is a flag: its value is true or false, got '%s'\n",
                    sp->cmd, path, line, key, val);
            return 2;
        }
        bool ok = i >= sp->n_opts ? opts__log(sp->cmd, i - sp->n_opts, val)
                                  : sp->apply(ctx, i, val, false) == 0;
        if (!ok) fprintf(stderr, "kvseal %s: (from %s:%d)\n", sp->cmd, path, line);
        return ok ? 0 : 2;
    }
    fprintf(stderr, "kvseal %s: %s:%d: unknown key '%s'\n", sp->cmd, path, line, key);
    return 2;
}

int cli__config_load(const cli__spec *sp, void *ctx, const char *path) {
    size_t len;
    char *text = cli__read_file(path, &len);
    if (!text) return 2;
    if (strlen(text) != len) {
        fprintf(stderr, "kvseal %s: %s: a NUL byte in a config file\n", sp->cmd, path);
        free(text);
        return 2;
    }
    int *first_line = calloc((size_t)(sp->n_opts + OPT__N), sizeof(int));
    if (!first_line) {
        fprintf(stderr, "kvseal %s: out of memory\n", sp->cmd);
        free(text);
        return 2;
    }
    int rc = 0, line = 0;
    for (char *p = text, *next; p && *p && !rc; p = next) {
        line++;
        char *nl = strchr(p, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = '\0';
        char *s = opts__trim(p);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            fprintf(stderr, "kvseal %s: %s:%d: expected 'key = value', got '%s'\n", sp->cmd, path,
                    line, s);
            rc = 2;
            break;
        }
        *eq = '\0';
        char *key = opts__trim(s), *val = opts__trim(eq + 1);
        size_t vn = strlen(val);
        if (vn >= 2 && val[0] == '"' && val[vn - 1] == '"') { // "quoted" keeps blanks and '#'
            val[vn - 1] = '\0';
            val++;
        }
        rc = opts__apply_config(sp, ctx, path, line, key, val, first_line);
    }
    free(first_line);
    free(text);
    return rc;
}

// ----------------------------------------------------------------------------
// Environment variables: KVSEAL_<NAME> for every option

int cli__opt_env_name(const char *opt, char *buf, size_t cap) {
    size_t n = strlen(opt);
    if (cap < n + sizeof "KVSEAL_") return -1;
    memcpy(buf, "KVSEAL_", 7);
    for (size_t i = 0; i <= n; i++) {
        char c = opt[i];
        buf[7 + i] = c == '-' ? '_' : c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
    }
    return (int)(n + 7);
}

/* Applies the environment's KVSEAL_<NAME> variables of sp's options (and
 * the layer's log-format and log-level; config is read by the caller) in
 * table order. Returns 0, or 2 after printing the error with the
 * variable's name. */
static int opts__apply_env(const cli__spec *sp, void *ctx) {
    for (int i = 0; i < sp->n_opts + OPT__N; i++) {
        const cli__opt *o = opts__at(sp, i);
        if (i - sp->n_opts == OPT_HELP || i - sp->n_opts == OPT_CONFIG) continue;
        char var[128];
        if (cli__opt_env_name(o->name, var, sizeof var) < 0) continue;
        const char *val = getenv(var);
        if (!val) continue;
        if (!o->has_arg) {
            if (!strcmp(val, "1") || !strcmp(val, "true"))
                val = "true";
            else if (!strcmp(val, "0") || !strcmp(val, "false"))
                val = "false";
            else {
                fprintf(stderr,
                        "kvseal %s: environment variable %s: --%s is a flag: its value is 1, 0, "
                        "true or false, got '%s'\n",
                        sp->cmd, var, o->name, val);
                return 2;
            }
        } else if (!*val) {
            fprintf(stderr, "kvseal %s: environment variable %s: empty value for --%s\n", sp->cmd,
                    var, o->name);
            return 2;
        }
        bool ok = i >= sp->n_opts ? opts__log(sp->cmd, i - sp->n_opts, val)
                                  : sp->apply(ctx, i, val, o->repeat) == 0;
        if (!ok) {
            fprintf(stderr, "kvseal %s: (from environment variable %s)\n", sp->cmd, var);
            return 2;
        }
    }
    return 0;
}

/* Why getopt_long refused arg: a flag given a value, a prefix of several
 * long names, or an unknown name. */
static const char *opts__why(const cli__spec *sp, const char *arg) {
    if (!arg || arg[0] != '-' || arg[1] != '-') return "unknown option";
    const char *name = arg + 2;
    size_t n = strcspn(name, "="), matches = 0;
    for (int i = 0; i < sp->n_opts + OPT__N; i++) {
        const cli__opt *o = opts__at(sp, i);
        if (i - sp->n_opts == OPT_CONFIG && !sp->config) continue;
        if (strlen(o->name) == n && !strncmp(o->name, name, n))
            return name[n] == '=' && !o->has_arg ? "a flag takes no value: option" : "bad option";
        if (!strncmp(o->name, name, n)) matches++;
    }
    return matches > 1 ? "ambiguous option (a prefix of several)" : "unknown option";
}

/* Prints the failing option as the user wrote it. */
static void opts__bad(const cli__spec *sp, const char *what, const char *arg, int optopt_c) {
    if (arg && arg[0] == '-' && arg[1] == '-') {
        size_t n = strcspn(arg, "=");
        fprintf(stderr, "kvseal %s: %s '%.*s'\n", sp->cmd, what, (int)n, arg);
    } else {
        fprintf(stderr, "kvseal %s: %s '-%c'\n", sp->cmd, what, optopt_c ? optopt_c : '?');
    }
    fprintf(stderr, "\n");
    if (sp->usage) sp->usage(sp->cmd);
}

int cli__opts_parse(const cli__spec *sp, void *ctx, int argc, char **argv, int *first_arg) {
    const int n_all = sp->n_opts + OPT__N;
    struct option *lo = calloc((size_t)n_all + 1, sizeof *lo);
    char *shorts = malloc((size_t)n_all * 2 + 4);
    bool *reset = calloc((size_t)n_all, sizeof(bool));
    int rc = 0;
    const char *config = NULL;
    if (!lo || !shorts || !reset) {
        fprintf(stderr, "kvseal %s: out of memory\n", sp->cmd);
        rc = 1;
        goto done;
    }
    size_t ns = 0;
    if (sp->args_last) shorts[ns++] = '+'; // POSIX order: stop at the first argument
    shorts[ns++] = ':'; // ':' first: a missing value is reported apart from an unknown option
    for (int i = 0, k = 0; i < n_all; i++) {
        const cli__opt *o = opts__at(sp, i);
        if (i - sp->n_opts == OPT_CONFIG && !sp->config) continue;
        lo[k++] =
            (struct option){o->name, o->has_arg ? required_argument : no_argument, NULL, 1000 + i};
        if (o->short_name) {
            shorts[ns++] = (char)o->short_name;
            if (o->has_arg) shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    // the file first, so that every command-line option, before or after
    // --config, overrides it; options then apply in their order, and the
    // first bad one is the one reported
    for (int i = 1; sp->config && i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else if (!strncmp(argv[i], "--config=", 9))
            config = argv[i] + 9;
    }
    const char *config_env = NULL; // KVSEAL_CONFIG, where the command line names no file
    if (sp->config && !config && (config_env = getenv("KVSEAL_CONFIG")) && *config_env)
        config = config_env;
    if (config && (rc = cli__config_load(sp, ctx, config))) {
        if (config == config_env)
            fprintf(stderr, "kvseal %s: (from environment variable KVSEAL_CONFIG)\n", sp->cmd);
        goto done;
    }
    // --help answers whatever the environment holds (a bad variable included)
    bool help = false;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        help = help || !strcmp(argv[i], "--help");
    if (!help && (rc = opts__apply_env(sp, ctx))) goto done;
    optind = 0; // glibc: 0 re-initializes, so the parser can run more than once a process
    opterr = 0;
    for (;;) {
        int li = -1;
        int c = getopt_long(argc, argv, shorts, lo, &li);
        if (c == -1) break;
        if (c == '?') {
            opts__bad(sp, opts__why(sp, argv[optind - 1]), argv[optind - 1], optopt);
            rc = 2;
            goto done;
        }
        if (c == ':') {
            opts__bad(sp, "missing value for option", argv[optind - 1], optopt);
            rc = 2;
            goto done;
        }
        int id = -1;
        if (c >= 1000) {
            id = c - 1000;
        } else {
            for (int i = 0; i < n_all && id < 0; i++)
                if (opts__at(sp, i)->short_name == c) id = i;
        }
        KS_ASSERT(id >= 0);
        if (id - sp->n_opts == OPT_HELP) {
            if (sp->usage) sp->usage(sp->cmd);
            fprintf(stderr,
                    "\nEvery option can also be set by an environment variable: KVSEAL_ and its\n"
                    "long name upper-cased, '-' as '_' (--log-level: KVSEAL_LOG_LEVEL; flags\n"
                    "take 1, 0, true or false). The command line wins over the environment,\n"
                    "the environment over a config file.\n");
            rc = -1;
            goto done;
        }
        if (id - sp->n_opts == OPT_CONFIG) {
            // loaded above, unless spelt as a prefix (--conf F): then here
            if (config != optarg && (!config || strcmp(config, optarg) != 0) &&
                (rc = cli__config_load(sp, ctx, config = optarg)))
                goto done;
            continue;
        }
        const char *v = opts__at(sp, id)->has_arg ? optarg : "true";
        if (id >= sp->n_opts) {
            rc = opts__log(sp->cmd, id - sp->n_opts, v) ? 0 : 2;
        } else {
            bool first = opts__at(sp, id)->repeat && !reset[id];
            reset[id] = true;
            rc = sp->apply(ctx, id, v, first);
        }
        if (rc) goto done;
    }
    if (first_arg) *first_arg = optind;
    if (!rc && !first_arg && optind < argc) {
        fprintf(stderr, "kvseal %s: unexpected argument '%s'\n\n", sp->cmd, argv[optind]);
        if (sp->usage) sp->usage(sp->cmd);
        rc = 2;
    }
done:
    free(lo);
    free(shorts);
    free(reset);
    return rc;
}

// ----------------------------------------------------------------------------
// Version

void cli__version_print(FILE *f) {
    fprintf(f, "kvseal %s", KS_VERSION);
    if (KS_GIT_DESCRIBE[0]) fprintf(f, " (git %s)", KS_GIT_DESCRIBE);
    fprintf(f, "\n");
    const ks_cpu *cpu = ks_cpu_get();
    fprintf(f, "cpu features:%s%s%s%s%s%s\n", cpu->avx2 ? " avx2" : "",
            cpu->avx512 ? " avx512" : "", cpu->avx512vnni ? " avx512vnni" : "",
            cpu->avx512bf16 ? " avx512bf16" : "", cpu->gfni ? " gfni" : "",
            cpu->avx2 || cpu->avx512 ? "" : " (none: scalar kernels)");
    ks_errbuf eb = {0};
    const char *force = getenv("KS_FORCE_ISA");
    bool forced = force && *force;
    ks_log_set_level(KS_LOG_WARN); // kern_init's "using ... kernels" line is said below
    if (kern_init(NULL, &eb) == KS_OK)
        fprintf(f, "kernels: %s%s%s%s\n", kern_get()->name, forced ? " (KS_FORCE_ISA=" : "",
                forced ? force : "", forced ? ")" : "");
    else
        fprintf(f, "kernels: %s (%s)\n", kern_get()->name, eb.msg);
    fprintf(f, "attention: %s\n", kern_attn_bf16(kern_get()) ? "bf16 (KS_ATTN=bf16)" : "f32");
    fprintf(f, "sd_notify: %s\n", cli__notify_available() ? "yes (libsystemd)" : "no");
    if (KS_BROKEN_BUILD[0])
        fprintf(f, "build: TEST-ONLY KS_BROKEN=%s (a safeguard is switched off: never deploy)\n",
                KS_BROKEN_BUILD);
    else
        fprintf(f, "build: release safeguards on\n");
}
