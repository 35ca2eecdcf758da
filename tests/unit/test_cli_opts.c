/* test_cli_opts.c — the command line's option layer (src/cli/opts.c) as
 * `kvseal serve` and the other subcommands parse through it: --opt=value
 * and --opt value, short options (-c256, -m F), `--` ending the options,
 * errors that name the option (exit 2), a --config FILE whose `key = value`
 * lines the command line overrides (in either order; a repeated option
 * replaces the file's list), a config error naming the file, line and key;
 * KVSEAL_<NAME> environment variables (over the file, under the command
 * line; a bad value refused naming the variable);
 * --log-format json lines; `kvseal --version`'s report (the version from
 * CMakeLists.txt's project VERSION); and the arithmetic behind perplexity's
 * "+/-" and bench's mean/stddev. (test_cli.c is the mkmodel-driven model
 * test; these checks need no model and run in well under a second.) */
#include "cli/cli_int.h"
#include "kvseal/kern.h"

#include "../check.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// stderr capture: fd 2 goes to a file while a check runs

static char cap_path[64];
static int cap_saved = -1;

static void cap_begin(void) {
    fflush(stderr);
    snprintf(cap_path, sizeof cap_path, "/tmp/ks_test_cli_opts_%d.err", (int)getpid());
    int fd = open(cap_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    cap_saved = dup(2);
    CHECK(dup2(fd, 2) == 2);
    close(fd);
}

/* Ends the capture; returns what was written (static buffer). */
static const char *cap_end(void) {
    static char buf[16384];
    fflush(stderr);
    dup2(cap_saved, 2);
    close(cap_saved);
    FILE *f = fopen(cap_path, "r");
    CHECK(f != NULL);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(cap_path);
    return buf;
}

/* serve__parse of a NULL-terminated argument list; err gets its stderr. */
static int parse(serve__cfg *c, const char **err, ...) {
    char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, err);
    argv[argc++] = "serve";
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    cap_begin();
    int rc = serve__parse(argc, argv, c);
    const char *e = cap_end();
    if (err) *err = e;
    return rc;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

// ----------------------------------------------------------------------------

/* Both spellings of a value, short options bundled or apart, flags, and a
 * unique prefix of a long name. */
static void test_forms(void) {
    serve__cfg c;
    const char *err;
    CHECK_EQ(parse(&c, &err, "--port=9001", "--alias", "a", "--alias=b", "-m", "x.gguf", "-c256",
                   "--no-prefix-cache", "--max-run=4", "--kv-type=f32", "-t", "3", NULL),
             0);
    CHECK_EQ(c.port, 9001);
    CHECK_EQ(c.n_aliases, 2);
    CHECK_STR_EQ(c.aliases[0], "a");
    CHECK_STR_EQ(c.aliases[1], "b");
    CHECK_STR_EQ(c.model_path, "x.gguf");
    CHECK_EQ(c.ctx, 256);
    CHECK_EQ(c.threads, 3);
    CHECK_EQ(c.max_running, 4);
    CHECK(c.no_prefix_cache && !c.log_content);
    CHECK_EQ(c.kv_type, KS_DTYPE_F32);
    CHECK_EQ(c.cluster_port, -1); // unset, apart from an explicit 0
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--model", "y.gguf", "--cluster-port", "0", NULL), 0);
    CHECK_STR_EQ(c.model_path, "y.gguf");
    CHECK_EQ(c.cluster_port, 0);
    serve__cfg_free(&c);
    // the first -m takes aliases as the others do: PATH,ALIAS[,ALIAS...]
    CHECK_EQ(parse(&c, &err, "-m", "z.gguf,zed,,z2", "--alias", "z3", "-m", "w.gguf,w", NULL), 0);
    CHECK_STR_EQ(c.model_path, "z.gguf");
    CHECK_EQ(c.n_aliases, 3);
    CHECK_STR_EQ(c.aliases[0], "zed");
    CHECK_STR_EQ(c.aliases[1], "z2");
    CHECK_STR_EQ(c.aliases[2], "z3");
    CHECK_EQ(c.n_more_models, 1);
    CHECK_STR_EQ(c.more_models[0], "w.gguf,w");
    serve__cfg_free(&c);
}

/* Every bad command line exits 2 with a message naming the option, and the
 * usage. */
static void test_errors(void) {
    serve__cfg c;
    const char *err;
    CHECK_EQ(parse(&c, &err, "--port", "1", "--bogus=3", NULL), 2);
    CHECK_STR_HAS(err, "kvseal serve: unknown option '--bogus'");
    CHECK_STR_HAS(err, "usage: kvseal serve");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "-x", NULL), 2);
    CHECK_STR_HAS(err, "unknown option '-x'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--port", NULL), 2);
    CHECK_STR_HAS(err, "missing value for option '--port'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "-m", NULL), 2);
    CHECK_STR_HAS(err, "missing value for option '-m'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--port=70000", NULL), 2);
    CHECK_STR_HAS(err, "--port expects an integer in [0, 65535], got '70000'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--no-prefix-cache=1", NULL), 2); // a flag takes no value
    CHECK_STR_HAS(err, "a flag takes no value: option '--no-prefix-cache'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--kv=4", NULL), 2);  // --kv-pages, --kv-memory, --kv-type
    CHECK_STR_HAS(err, "ambiguous option (a prefix of several) '--kv'");
    serve__cfg_free(&c);
    // `--` ends the options: what follows is an argument, which serve has none of
    CHECK_EQ(parse(&c, &err, "--port", "5", "--", "--port", "6", NULL), 2);
    CHECK_STR_HAS(err, "unexpected argument '--port'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--kv-pages", "4", "--kv-memory", "1G", NULL), 2);
    CHECK_STR_HAS(err, "not both");
    serve__cfg_free(&c);
    // an admin key a guesser could reach is refused (16 bytes at least, as
    // the cluster secret); 16 is enough
    CHECK_EQ(parse(&c, &err, "--admin-key", "adm-short", NULL), 2);
    CHECK_STR_HAS(err, "--admin-key has 9 bytes; at least 16 are needed");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--metrics-key", "mk-short", NULL), 2);
    CHECK_STR_HAS(err, "--metrics-key has 8 bytes; at least 16 are needed");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--admin-key=0123456789abcdef", NULL), 0);
    CHECK_STR_EQ(c.admin_key, "0123456789abcdef");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--help", NULL), -1);
    CHECK_STR_HAS(err, "--config FILE");
    serve__cfg_free(&c);
}

/* The file's values apply; the command line's win whatever their order; a
 * command-line --alias replaces the file's aliases; string values outlive
 * the file's buffer. */
static void test_config(void) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/ks_test_cli_opts_%d.conf", (int)getpid());
    write_file(path, "# kvseal serve\n"
                     "port = 9100\n"
                     "\n"
                     "  alias=f1\n"
                     "alias = f2\n"
                     "ctx = 128\n"
                     "no-prefix-cache = true\n"
                     "host = \"127.0.0.1\"\n"
                     "tenants = /etc/kvseal/tenants.json   \n");
    serve__cfg c;
    const char *err;
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 0);
    CHECK_EQ(c.port, 9100);
    CHECK_EQ(c.ctx, 128);
    CHECK_EQ(c.n_aliases, 2);
    CHECK_STR_EQ(c.aliases[0], "f1");
    CHECK_STR_EQ(c.aliases[1], "f2");
    CHECK(c.no_prefix_cache);
    CHECK_STR_EQ(c.host, "127.0.0.1");
    CHECK_STR_EQ(c.tenants, "/etc/kvseal/tenants.json");
    serve__cfg_free(&c);
    // flags after the file override it ...
    CHECK_EQ(parse(&c, &err, "--config", path, "--port", "9200", "--alias", "c1", NULL), 0);
    CHECK_EQ(c.port, 9200);
    CHECK_EQ(c.n_aliases, 1);
    CHECK_STR_EQ(c.aliases[0], "c1");
    CHECK_EQ(c.ctx, 128); // what the command line leaves alone stays the file's
    serve__cfg_free(&c);
    // ... and so do flags before it
    CHECK_EQ(parse(&c, &err, "--port=9300",
                   "--config="
                   "/dev/null",
                   NULL),
             0);
    CHECK_EQ(c.port, 9300);
    serve__cfg_free(&c);
    char arg[160];
    snprintf(arg, sizeof arg, "--config=%s", path);
    CHECK_EQ(parse(&c, &err, "--port=9300", arg, NULL), 0);
    CHECK_EQ(c.port, 9300);
    CHECK_EQ(c.n_aliases, 2);
    serve__cfg_free(&c);
    // a flag set by the file is cleared by false
    write_file(path, "no-prefix-cache = false\nlog-content = true\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 0);
    CHECK(!c.no_prefix_cache && c.log_content);
    serve__cfg_free(&c);

    // errors name the file, the line and the key
    char want[256];
    write_file(path, "port = 1\n# fine\nbogus = 3\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    snprintf(want, sizeof want, "%s:3: unknown key 'bogus'", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    write_file(path, "port 8080\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    snprintf(want, sizeof want, "%s:1: expected 'key = value'", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    write_file(path, "\nno-prefix-cache = maybe\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    snprintf(want, sizeof want, "%s:2: 'no-prefix-cache' is a flag", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    write_file(path, "port = 99999\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    CHECK_STR_HAS(err, "--port expects an integer in [0, 65535], got '99999'");
    snprintf(want, sizeof want, "(from %s:1)", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    // a key given twice is refused, naming both lines (it would silently
    // win otherwise); a repeatable option (alias) may be given many times
    write_file(path, "port = 1\nctx = 64\n\nport = 2\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    snprintf(want, sizeof want, "%s:4: duplicate key 'port' (first set on line 1)", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    write_file(path, "log-level = info\nlog-level=warn\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    snprintf(want, sizeof want, "%s:2: duplicate key 'log-level' (first set on line 1)", path);
    CHECK_STR_HAS(err, want);
    serve__cfg_free(&c);
    write_file(path, "alias = a\nalias = b\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 0);
    CHECK_EQ(c.n_aliases, 2);
    serve__cfg_free(&c);
    write_file(path, "config = /etc/other\n"); // no nesting
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2);
    CHECK_STR_HAS(err, "unknown key 'config'");
    serve__cfg_free(&c);
    unlink(path);
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 2); // gone
    CHECK_STR_HAS(err, path);
    serve__cfg_free(&c);
}

/* --log-format json from the command line: a log line is one JSON object
 * with ts (RFC 3339 UTC, milliseconds), level, msg and the call's fields;
 * text lines carry the same timestamp. */
static void test_log_format(void) {
    serve__cfg c;
    const char *err;
    CHECK_EQ(parse(&c, &err, "--log-format=json", "--log-level", "debug", NULL), 0);
    serve__cfg_free(&c);
    cap_begin();
    ks_log(KS_LOG_DEBUG, "say \"hi\"\n\tthere");
    ks_log_fields(KS_LOG_ERROR, "{\"event\":\"x\",\"page\":3}", "SECURITY %s", "{\"event\":\"x\"}");
    const char *out = cap_end();
    CHECK_STR_HAS(out, "{\"ts\":\"20");
    CHECK_STR_HAS(out, "Z\",\"level\":\"debug\",\"msg\":\"say \\\"hi\\\"\\n\\u0009there\"}\n");
    CHECK_STR_HAS(out, "\"level\":\"error\",\"msg\":\"SECURITY {\\\"event\\\":\\\"x\\\"}\","
                       "\"event\":\"x\",\"page\":3}\n");
    // ts: YYYY-MM-DDTHH:MM:SS.mmmZ
    const char *ts = strstr(out, "\"ts\":\"") + 6;
    CHECK(ts[4] == '-' && ts[7] == '-' && ts[10] == 'T' && ts[13] == ':' && ts[19] == '.' &&
          ts[23] == 'Z');
    CHECK_EQ(parse(&c, &err, "--log-format", "yaml", NULL), 2);
    CHECK_STR_HAS(err, "--log-format expects text or json, got 'yaml'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--log-format", "text", "--log-level=info", NULL), 0);
    serve__cfg_free(&c);
    cap_begin();
    ks_log(KS_LOG_DEBUG, "hidden");
    ks_log(KS_LOG_WARN, "plain");
    out = cap_end();
    CHECK(strstr(out, "hidden") == NULL);
    CHECK(out[4] == '-' && out[10] == 'T' && out[23] == 'Z');
    CHECK_STR_HAS(out, "Z kvseal warn: plain\n");
}

/* kvseal --version: CMakeLists.txt's project VERSION, the CPU's features,
 * the kernels in use, and what kind of build this is. */
static void test_version(void) {
    const char *src = getenv("KS_SRC");
    char path[1024], want[128] = "";
    snprintf(path, sizeof path, "%s/CMakeLists.txt", src ? src : ".");
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char v[64];
        if (sscanf(line, "project(kvseal VERSION %63[0-9.]", v) == 1)
            snprintf(want, sizeof want, "kvseal %s", v);
    }
    fclose(f);
    CHECK(want[0]);
    char out_path[64];
    snprintf(out_path, sizeof out_path, "/tmp/ks_test_cli_opts_%d.ver", (int)getpid());
    f = fopen(out_path, "w+");
    CHECK(f != NULL);
    cli__version_print(f);
    rewind(f);
    char text[2048];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(out_path);
    fprintf(stderr, "%s", text);
    CHECK(!strncmp(text, want, strlen(want)));
    CHECK_STR_HAS(text, "\ncpu features:");
    if (ks_cpu_get()->avx2) CHECK_STR_HAS(text, " avx2");
    char k[64];
    snprintf(k, sizeof k, "\nkernels: %s", kern_get()->name);
    CHECK_STR_HAS(text, k);
    CHECK_STR_HAS(text, cli__notify_available() ? "sd_notify: yes" : "sd_notify: no");
#ifdef KS_BROKEN_NAME
    CHECK_STR_HAS(text, "build: TEST-ONLY KS_BROKEN=" KS_BROKEN_NAME);
#else
    CHECK_STR_HAS(text, "build: release");
    CHECK(strstr(text, "TEST-ONLY") == NULL);
#endif
    ks_log_set_level(KS_LOG_INFO);
}

/* perplexity's "+/-" and bench's spread, on numbers worked by hand. */
static void test_stats(void) {
    // NLLs 1, 2, 3: mean 2, mean square 14/3, variance 2/3, se sqrt(1/3)
    double se = cli__ppl_stderr(6.0, 14.0, 3);
    CHECK_NEAR(se, sqrt(1.0 / 3.0) * exp(2.0), 1e-12);
    CHECK(cli__ppl_stderr(6.0, 12.0, 3) < 0); // all equal: no spread
    CHECK(cli__ppl_stderr(1.0, 1.0, 1) < 0);
    double m, sd;
    const double x[4] = {1, 2, 3, 4};
    cli__stats(x, 4, &m, &sd);
    CHECK_NEAR(m, 2.5, 1e-12);
    CHECK_NEAR(sd, sqrt(5.0 / 3.0), 1e-12);
    cli__stats(x, 1, &m, &sd);
    CHECK(m == 1 && sd == 0);
}

/* The other subcommands parse through the same layer. */
static void test_subcommands(void) {
    char *a1[] = {"perplexity", "--bogus", NULL};
    cap_begin();
    int rc = cli_perplexity(2, a1);
    const char *err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "kvseal perplexity: unknown option '--bogus'");
    CHECK_STR_HAS(err, "usage: kvseal perplexity");
    char *a2[] = {"perplexity", "-c", "64", NULL};
    cap_begin();
    rc = cli_perplexity(3, a2);
    err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "-f TEXTFILE is required");
    char *a3[] = {"bench", "-o", "xml", NULL};
    cap_begin();
    rc = cli_bench(3, a3);
    err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "-o expects text, md or json, got 'xml'");
    char *a4[] = {"bench", "--output=json", "--streams=1,2", NULL};
    cap_begin();
    rc = cli_bench(3, a4);
    err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "--streams prints text");
    char *a5[] = {"run", "--temp=0", NULL};
    cap_begin();
    rc = cli_run(2, a5);
    err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "-p PROMPT is required");
    char *a6[] = {"inspect", "--nope", NULL};
    cap_begin();
    rc = cli_inspect(2, a6);
    err = cap_end();
    CHECK_EQ(rc, 2);
    CHECK_STR_HAS(err, "unknown option '--nope'");
    char *a7[] = {"kvseal", "version", NULL};
    CHECK_EQ(cli_main(2, a7), 0);
    ks_log_set_level(KS_LOG_INFO);
}

/* --router repeats and takes comma lists (a worker registers with every
 * router, issue 40); a config file's routers are replaced by the command
 * line's; the redis limit options parse, a share outside (0, 1] is refused. */
static void test_routers(void) {
    serve__cfg c;
    const char *err;
    CHECK_EQ(parse(&c, &err, "--router", "a:1,b:2", "--router=c:3", "--limits-redis", "r:6379",
                   "--limits-redis-prefix", "fleet:", "--limits-local-share", "0.5", NULL),
             0);
    CHECK_EQ(c.n_routers, 3);
    CHECK_STR_EQ(c.routers[0], "a:1");
    CHECK_STR_EQ(c.routers[1], "b:2");
    CHECK_STR_EQ(c.routers[2], "c:3");
    CHECK_STR_EQ(c.limits_redis, "r:6379");
    CHECK_STR_EQ(c.limits_redis_prefix, "fleet:");
    CHECK(c.limits_local_share == 0.5);
    serve__cfg_free(&c);
    char path[128];
    snprintf(path, sizeof path, "/tmp/ks_test_cli_routers_%d.conf", (int)getpid());
    write_file(path, "router = f:1, g:2\n");
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 0);
    CHECK_EQ(c.n_routers, 2);
    CHECK_STR_EQ(c.routers[1], "g:2"); // spaces around list items go
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--config", path, "--router", "h:3", NULL), 0);
    CHECK_EQ(c.n_routers, 1);
    CHECK_STR_EQ(c.routers[0], "h:3");
    serve__cfg_free(&c);
    unlink(path);
    CHECK_EQ(parse(&c, &err, "--limits-local-share", "1.5", NULL), 2);
    CHECK_STR_HAS(err, "--limits-local-share expects a fraction in (0, 1]");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--router", "a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9", "--router",
                   "j:1,k:2,l:3,m:4,n:5,o:6,p:7,q:8", NULL),
             2);
    CHECK_STR_HAS(err, "at most 16 --router addresses");
    serve__cfg_free(&c);
}

/* The environment: every option's KVSEAL_<NAME> (derived from the table),
 * over the config file and under the command line; flags take 1/0/true/
 * false; a bad value is refused naming the variable; --help says so once. */
static void test_env(void) {
    char var[64];
    CHECK_EQ(cli__opt_env_name("port", var, sizeof var), 11);
    CHECK_STR_EQ(var, "KVSEAL_PORT");
    CHECK_EQ(cli__opt_env_name("ssl-cert-file", var, sizeof var), 20);
    CHECK_STR_EQ(var, "KVSEAL_SSL_CERT_FILE");
    CHECK_EQ(cli__opt_env_name("ssl-cert-file", var, 20), -1); // no room for the NUL
    serve__cfg c;
    const char *err;
    // environment over the default
    CHECK_EQ(setenv("KVSEAL_PORT", "9101", 1), 0);
    CHECK_EQ(setenv("KVSEAL_MAX_RUNNING", "5", 1), 0);
    CHECK_EQ(setenv("KVSEAL_LOG_CONTENT", "1", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 0);
    CHECK_EQ(c.port, 9101);
    CHECK_EQ(c.max_running, 5);
    CHECK(c.log_content);
    serve__cfg_free(&c);
    // an option added by another change gets its variable with no code of its own
    CHECK_EQ(setenv("KVSEAL_SSL_CERT_FILE", "/etc/kvseal/cert.pem", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 0);
    CHECK(c.ssl_cert_file != NULL);
    CHECK_STR_EQ(c.ssl_cert_file, "/etc/kvseal/cert.pem");
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_SSL_CERT_FILE"), 0);
    // the command line over the environment, either spelling
    CHECK_EQ(parse(&c, &err, "--port", "9102", "--max-running=6", NULL), 0);
    CHECK_EQ(c.port, 9102);
    CHECK_EQ(c.max_running, 6);
    serve__cfg_free(&c);
    // flags: 0 and false turn one off, true on
    CHECK_EQ(setenv("KVSEAL_LOG_CONTENT", "0", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 0);
    CHECK(!c.log_content);
    serve__cfg_free(&c);
    CHECK_EQ(setenv("KVSEAL_LOG_CONTENT", "true", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 0);
    CHECK(c.log_content);
    serve__cfg_free(&c);
    // the environment over a config file (KVSEAL_CONFIG names one too)
    char path[128];
    snprintf(path, sizeof path, "/tmp/ks_test_cli_opts_env_%d.conf", (int)getpid());
    write_file(path, "port = 9300\nctx = 64\nalias = f1\n");
    CHECK_EQ(setenv("KVSEAL_ALIAS", "e1", 1), 0);
    CHECK_EQ(parse(&c, &err, "--config", path, NULL), 0);
    CHECK_EQ(c.port, 9101);   // the environment's
    CHECK_EQ(c.ctx, 64);      // the file's
    CHECK_EQ(c.n_aliases, 1); // a repeatable option: the variable replaces the file's list
    CHECK_STR_EQ(c.aliases[0], "e1");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--config", path, "--alias", "c1", NULL), 0);
    CHECK_EQ(c.n_aliases, 1); // ... and the command line replaces the variable's
    CHECK_STR_EQ(c.aliases[0], "c1");
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_ALIAS"), 0);
    CHECK_EQ(setenv("KVSEAL_CONFIG", path, 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 0);
    CHECK_EQ(c.ctx, 64);
    CHECK_EQ(c.port, 9101);
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_CONFIG"), 0);
    unlink(path);
    // malformed values: refused (exit 2) naming the variable
    CHECK_EQ(setenv("KVSEAL_LOG_CONTENT", "yes", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 2);
    CHECK_STR_HAS(err, "environment variable KVSEAL_LOG_CONTENT");
    CHECK_STR_HAS(err, "1, 0, true or false, got 'yes'");
    serve__cfg_free(&c);
    CHECK_EQ(parse(&c, &err, "--help", NULL), -1); // help whatever the environment holds
    CHECK_STR_HAS(err, "usage: kvseal serve");
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_LOG_CONTENT"), 0);
    CHECK_EQ(setenv("KVSEAL_PORT", "http", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 2);
    CHECK_STR_HAS(err, "--port expects an integer");
    CHECK_STR_HAS(err, "(from environment variable KVSEAL_PORT)");
    serve__cfg_free(&c);
    CHECK_EQ(setenv("KVSEAL_PORT", "", 1), 0);
    CHECK_EQ(parse(&c, &err, NULL), 2);
    CHECK_STR_HAS(err, "environment variable KVSEAL_PORT: empty value for --port");
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_PORT"), 0);
    CHECK_EQ(setenv("KVSEAL_LOG_LEVEL", "loud", 1), 0); // the layer's own options too
    CHECK_EQ(parse(&c, &err, NULL), 2);
    CHECK_STR_HAS(err, "(from environment variable KVSEAL_LOG_LEVEL)");
    serve__cfg_free(&c);
    CHECK_EQ(unsetenv("KVSEAL_LOG_LEVEL"), 0);
    CHECK_EQ(unsetenv("KVSEAL_MAX_RUNNING"), 0);
    // --help says it once
    CHECK_EQ(parse(&c, &err, "--help", NULL), -1);
    const char *hit = strstr(err, "environment variable: KVSEAL_");
    CHECK(hit != NULL);
    CHECK(strstr(hit + 1, "environment variable: KVSEAL_") == NULL);
    serve__cfg_free(&c);
    ks_log_set_level(KS_LOG_INFO);
}

int main(void) {
    test_routers();
    test_forms();
    test_errors();
    test_config();
    test_env();
    test_log_format();
    test_version();
    test_stats();
    test_subcommands();
    printf("cli opts ok\n");
    return 0;
}
