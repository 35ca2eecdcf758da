/* metrics.c — Prometheus counters and histograms for /metrics, and the
 * security event log.
 *
 * Counters are lock-free atomics bumped from the connection threads;
 * rendering reads them with relaxed loads (a scrape may be a request stale)
 * and adds the engine's gauges (queue, running, KV pages by state,
 * isolation violations, prefix-cache hits) from engine_get_stats. The text
 * follows the exposition format 0.0.4: # HELP / # TYPE, cumulative
 * histogram buckets with le="+Inf", _sum and _count. The process_* series
 * (Prometheus's standard names for a process) come from /proc/self. */
#include "server_int.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const int met__status[SRV_N_STATUS] = {200, 400, 401, 403, 404, 405, 408, 413,
                                              415, 429, 499, 500, 501, 503, 204, 0};
static const double met__ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5,   1,    2.5,   5,    10,  30};
static const double met__tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.1,   0.25,   0.5,   1,    2.5};
static const double met__e2e_bounds[] = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,  10,
                                         15,   20,  30,   60,  120, 300, 600};
static const double met__queue_bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                           0.5,   1,     2.5,  5,     10,   30,  60};

// ----------------------------------------------------------------------------
// Counting

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    m->ttft.bounds = met__ttft_bounds;
    m->ttft.n = (int)(sizeof met__ttft_bounds / sizeof met__ttft_bounds[0]);
    m->tpot.bounds = met__tpot_bounds;
    m->tpot.n = (int)(sizeof met__tpot_bounds / sizeof met__tpot_bounds[0]);
    m->e2e.bounds = met__e2e_bounds;
    m->e2e.n = (int)(sizeof met__e2e_bounds / sizeof met__e2e_bounds[0]);
    m->queue.bounds = met__queue_bounds;
    m->queue.n = (int)(sizeof met__queue_bounds / sizeof met__queue_bounds[0]);
    _Static_assert(sizeof met__e2e_bounds / sizeof met__e2e_bounds[0] < 16, "srv_hist.count");
    _Static_assert(sizeof met__queue_bounds / sizeof met__queue_bounds[0] < 16, "srv_hist.count");
}

void srv_metrics_finish(srv_metrics *m, engine_finish f) {
    int i = f == ENGINE_FINISH_STOP ? 0 : f == ENGINE_FINISH_LENGTH ? 1 : 2;
    atomic_fetch_add_explicit(&m->finished[i], 1, memory_order_relaxed);
}

static int met__status_idx(int status) {
    for (int i = 0; i < SRV_N_STATUS - 1; i++)
        if (met__status[i] == status) return i;
    return SRV_N_STATUS - 1;
}

void srv_metrics_request(srv_metrics *m, srv_route route, int status) {
    if ((unsigned)route >= SRV_ROUTE__COUNT) route = SRV_ROUTE_OTHER;
    atomic_fetch_add_explicit(&m->requests[route][met__status_idx(status)], 1,
                              memory_order_relaxed);
}

void srv_metrics_reject(srv_metrics *m, admit_reason r) {
    if (admit_reason_is_refusal(r))
        atomic_fetch_add_explicit(&m->rejections[r], 1, memory_order_relaxed);
}

void srv_hist_observe(srv_hist *h, double seconds) {
    if (!(seconds >= 0)) seconds = 0;
    int b = 0;
    while (b < h->n && seconds > h->bounds[b])
        b++;
    atomic_fetch_add_explicit(&h->count[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->n_obs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (unsigned long long)(seconds * 1e9),
                              memory_order_relaxed);
}

// ----------------------------------------------------------------------------
// Rendering

#define LOAD(x) ((unsigned long long)atomic_load_explicit(&(x), memory_order_relaxed))

static bool met__printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool met__printf(srv_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) return false;
    return srv_buf_add(b, tmp, (size_t)n);
}

bool srv_prom_label(srv_buf *b, const char *v) {
    bool ok = true;
    for (const char *p = v; *p && ok; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        ok = esc ? srv_buf_add(b, esc, 2) : srv_buf_add(b, p, 1);
    }
    return ok;
}

/* `{` + lbl + `=` "val" (escaped) + sep: the start of a labelled series's
 * label set, e.g. met__lbl(b, "model_name", name, ",") before le="...". */
static bool met__lbl(srv_buf *b, const char *lbl, const char *val, const char *sep) {
    return srv_buf_add(b, "{", 1) && srv_buf_add(b, lbl, strlen(lbl)) && srv_buf_add(b, "=\"", 2) &&
           srv_prom_label(b, val) && srv_buf_add(b, "\"", 1) && srv_buf_add(b, sep, strlen(sep));
}

/* A histogram; with mname (non-NULL) every sample carries model_name. */
static bool met__hist_l(srv_buf *b, const char *name, const char *help, srv_hist *h,
                        const char *mname) {
    bool ok = met__printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i <= h->n && ok; i++) {
        cum += LOAD(h->count[i]);
        ok = met__printf(b, "%s_bucket", name) &&
             (mname ? met__lbl(b, "model_name", mname, ",") : srv_buf_add(b, "{", 1));
        if (ok && i < h->n)
            ok = met__printf(b, "le=\"%g\"} %llu\n", h->bounds[i], cum);
        else if (ok)
            ok = met__printf(b, "le=\"+Inf\"} %llu\n", cum);
    }
    const char *end = mname ? "} " : " ";
    ok = ok && met__printf(b, "%s_sum", name) && (!mname || met__lbl(b, "model_name", mname, "")) &&
         met__printf(b, "%s%.9f\n%s_count", end, (double)LOAD(h->sum_ns) * 1e-9, name) &&
         (!mname || met__lbl(b, "model_name", mname, "")) &&
         met__printf(b, "%s%llu\n", end, LOAD(h->n_obs));
    return ok;
}

static bool met__hist(srv_buf *b, const char *name, const char *help, srv_hist *h) {
    return met__hist_l(b, name, help, h, NULL);
}

/* One sample `name{model_name="..."} value` (value already formatted). */
static bool met__model_sample(srv_buf *b, const char *name, const char *mname, const char *value) {
    return srv_buf_add(b, name, strlen(name)) && met__lbl(b, "model_name", mname, "} ") &&
           srv_buf_add(b, value, strlen(value)) && srv_buf_add(b, "\n", 1);
}

/* A mname-level vllm:* gauge or counter: HELP, TYPE and its one sample. */
static bool met__vllm(srv_buf *b, const char *name, const char *type, const char *help,
                      const char *mname, const char *value) {
    return met__printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type) &&
           met__model_sample(b, name, mname, value);
}

/* Per-tenant counters: one series per tenant of the tenants file. */
static bool met__tenants(srv_buf *b, const srv_tenants *ts) {
    static const struct {
        const char *name, *help;
        size_t off;
    } ctr[] = {
        {"kvseal_tenant_requests_total", "Answers to requests authenticated as the tenant.",
         offsetof(srv_tenant, m_requests)},
        {"kvseal_tenant_rate_limited_total", "Answers 429 for the tenant's own limits.",
         offsetof(srv_tenant, m_limited)},
        {"kvseal_tenant_prompt_tokens_total", "Prompt tokens of the tenant's finished requests.",
         offsetof(srv_tenant, m_prompt)},
        {"kvseal_tenant_generation_tokens_total", "Tokens generated for the tenant.",
         offsetof(srv_tenant, m_generation)},
        {"kvseal_tenant_grammar_mask_microseconds_total",
         "CPU the tenant's grammar masks took (structured output), in microseconds.",
         offsetof(srv_tenant, m_mask_us)},
        {"kvseal_tenant_spec_draft_tokens_total",
         "Speculative decoding: draft tokens computed for the tenant's requests.",
         offsetof(srv_tenant, m_spec_drafted)},
        {"kvseal_tenant_spec_accepted_tokens_total",
         "Speculative decoding: the tenant's draft tokens its own draws kept.",
         offsetof(srv_tenant, m_spec_accepted)},
    };
    bool ok = true;
    for (size_t k = 0; k < sizeof ctr / sizeof ctr[0] && ok; k++) {
        ok = met__printf(b, "# HELP %s %s\n# TYPE %s counter\n", ctr[k].name, ctr[k].help,
                         ctr[k].name);
        for (size_t i = 0; i < ts->n && ok; i++) {
            atomic_ullong *v = (atomic_ullong *)((char *)&ts->t[i] + ctr[k].off);
            ok = srv_buf_add(b, ctr[k].name, strlen(ctr[k].name)) &&
                 met__lbl(b, "tenant", ts->t[i].name, "} ") &&
                 met__printf(b, "%llu\n",
                             (unsigned long long)atomic_load_explicit(v, memory_order_relaxed));
        }
    }
    if (ok && ts->redis) // --limits-redis: is the shared store answering?
        ok = met__printf(b,
                         "# HELP kvseal_limits_redis_up 1 while the last tenant-limit call "
                         "reached redis (0: limits use this process's local share).\n"
                         "# TYPE kvseal_limits_redis_up gauge\nkvseal_limits_redis_up %d\n"
                         "# HELP kvseal_limits_redis_errors_total Tenant-limit calls that found "
                         "redis unreachable.\n"
                         "# TYPE kvseal_limits_redis_errors_total counter\n"
                         "kvseal_limits_redis_errors_total %llu\n",
                         atomic_load(&ts->redis_up) ? 1 : 0,
                         (unsigned long long)atomic_load(&ts->m_redis_errors));
    return ok;
}

/* The series a vLLM Grafana dashboard reads, from the same counters and
 * histograms as kvseal's own (docs/metrics.md: the mapping). */
static bool met__vllm_all(srv_buf *b, srv_metrics *m, const engine_stats *es, const char *mname) {
    char v[64];
    bool ok = true;
    if (es) {
        uint64_t total = 0;
        for (int i = 0; i < 4; i++)
            total += es->kv.pages[i];
        double usage = total ? 1.0 - (double)es->kv.pages[0] / (double)total : 0.0;
        snprintf(v, sizeof v, "%u", es->n_running);
        ok = ok && met__vllm(b, "vllm:num_requests_running", "gauge",
                             "Number of requests in mname execution batches.", mname, v);
        snprintf(v, sizeof v, "%u", es->n_queued);
        ok = ok && met__vllm(b, "vllm:num_requests_waiting", "gauge",
                             "Number of requests waiting to be processed.", mname, v);
        snprintf(v, sizeof v, "%.6f", usage);
        ok = ok &&
             met__vllm(b, "vllm:kv_cache_usage_perc", "gauge",
                       "KV-cache usage. 1 means 100 percent usage.", mname, v) &&
             met__vllm(b, "vllm:gpu_cache_usage_perc", "gauge",
                       "KV-cache usage. 1 means 100 percent usage (the older name).", mname, v);
        snprintf(v, sizeof v, "%llu", (unsigned long long)es->spec_steps);
        ok = ok && met__vllm(b, "vllm:spec_decode_num_drafts_total", "counter",
                             "Number of spec decoding drafts.", mname, v);
        snprintf(v, sizeof v, "%llu", (unsigned long long)es->spec_drafted);
        ok = ok && met__vllm(b, "vllm:spec_decode_num_draft_tokens_total", "counter",
                             "Number of draft tokens.", mname, v);
        snprintf(v, sizeof v, "%llu", (unsigned long long)es->spec_accepted);
        ok = ok && met__vllm(b, "vllm:spec_decode_num_accepted_tokens_total", "counter",
                             "Number of accepted tokens.", mname, v);
    }
    snprintf(v, sizeof v, "%llu", LOAD(m->tokens_in));
    ok = ok && met__vllm(b, "vllm:prompt_tokens_total", "counter",
                         "Number of prefill tokens processed.", mname, v);
    snprintf(v, sizeof v, "%llu", LOAD(m->tokens_out));
    ok = ok && met__vllm(b, "vllm:generation_tokens_total", "counter",
                         "Number of generation tokens processed.", mname, v);
    static const char *const reasons[3] = {"stop", "length", "abort"};
    ok = ok && met__printf(b, "# HELP vllm:request_success_total Count of successfully processed "
                              "requests.\n# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < 3 && ok; i++)
        ok = srv_buf_add(b, "vllm:request_success_total", 26) &&
             met__lbl(b, "finished_reason", reasons[i], ",") && met__printf(b, "model_name=\"") &&
             srv_prom_label(b, mname) && met__printf(b, "\"} %llu\n", LOAD(m->finished[i]));
    return ok &&
           met__hist_l(b, "vllm:time_to_first_token_seconds",
                       "Histogram of time to first token in seconds.", &m->ttft, mname) &&
           met__hist_l(b, "vllm:time_per_output_token_seconds",
                       "Histogram of time per output token in seconds.", &m->tpot, mname) &&
           met__hist_l(b, "vllm:e2e_request_latency_seconds",
                       "Histogram of end to end request latency in seconds.", &m->e2e, mname) &&
           met__hist_l(b, "vllm:request_queue_time_seconds",
                       "Histogram of time spent in WAITING phase for request.", &m->queue, mname);
}

// ----------------------------------------------------------------------------
// process_*: the standard series every Prometheus client library exports

/* The process's CPU, memory and start figures from /proc/self/stat (fields
 * 14-15 utime/stime and 22 starttime in clock ticks, 23 vsize in bytes, 24
 * rss in pages; comm, field 2, may hold blanks and parentheses, so fields
 * are counted from its last ')') and the boot time from /proc/stat. False
 * when /proc cannot be read (then no process_* series are written). */
static bool met__proc_stat(double *cpu_s, double *rss, double *vsize, double *start_s) {
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p) return false;
    unsigned long long v[22] = {0}; // fields 3.. (state is read as a skipped %*c)
    int got =
        sscanf(p + 1,
               " %*c %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu "
               "%llu %llu %llu %llu %llu %llu %llu",
               &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
               &v[12], &v[13], &v[14], &v[15], &v[16], &v[17], &v[18], &v[19], &v[20]);
    if (got < 21) return false;
    // v[k] is field k + 4: utime 14, stime 15, starttime 22, vsize 23, rss 24
    double tick = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
    if (tick <= 0 || page <= 0) return false;
    *cpu_s = (double)(v[10] + v[11]) / tick;
    *vsize = (double)v[19];
    *rss = (double)v[20] * page;
    unsigned long long btime = 0;
    if ((f = fopen("/proc/stat", "r"))) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %llu", &btime) == 1) break;
        fclose(f);
    }
    *start_s = btime ? (double)btime + (double)v[18] / tick : 0;
    return true;
}

/* process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds and
 * process_start_time_seconds; writes nothing (and succeeds) off Linux. */
static bool met__process(srv_buf *b) {
    double cpu_s, rss, vsize, start_s;
    if (!met__proc_stat(&cpu_s, &rss, &vsize, &start_s)) return true;
    long n_fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        for (struct dirent *e; (e = readdir(d));)
            n_fds += e->d_name[0] != '.';
        closedir(d);
        n_fds--; // opendir's own descriptor
    }
    struct rlimit rl;
    double max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                         ? (double)rl.rlim_cur
                         : -1;
    bool ok = met__printf(b,
                          "# HELP process_cpu_seconds_total Total user and system CPU time spent "
                          "in seconds.\n# TYPE process_cpu_seconds_total counter\n"
                          "process_cpu_seconds_total %.2f\n"
                          "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                          "# TYPE process_resident_memory_bytes gauge\n"
                          "process_resident_memory_bytes %.0f\n"
                          "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                          "# TYPE process_virtual_memory_bytes gauge\n"
                          "process_virtual_memory_bytes %.0f\n",
                          cpu_s, rss, vsize);
    if (ok && d)
        ok = met__printf(b,
                         "# HELP process_open_fds Number of open file descriptors.\n"
                         "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
                         n_fds);
    if (ok && max_fds > 0)
        ok = met__printf(b,
                         "# HELP process_max_fds Maximum number of open file descriptors.\n"
                         "# TYPE process_max_fds gauge\nprocess_max_fds %.0f\n",
                         max_fds);
    if (ok && start_s > 0)
        ok = met__printf(b,
                         "# HELP process_start_time_seconds Start time of the process since unix "
                         "epoch in seconds.\n# TYPE process_start_time_seconds gauge\n"
                         "process_start_time_seconds %.2f\n",
                         start_s);
    return ok;
}

char *srv_metrics_render(srv_metrics *m, const engine_stats *es, bool online) {
    srv_buf b = {0};
    bool ok = met__printf(&b, "# HELP kvseal_requests_total HTTP requests answered, by route "
                              "and status.\n# TYPE kvseal_requests_total counter\n");
    for (int r = 0; r < SRV_ROUTE__COUNT && ok; r++)
        for (int s = 0; s < SRV_N_STATUS && ok; s++) {
            unsigned long long v = LOAD(m->requests[r][s]);
            if (!v) continue;
            if (met__status[s])
                ok = met__printf(&b, "kvseal_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                                 srv_route_name((srv_route)r), met__status[s], v);
            else
                ok = met__printf(&b, "kvseal_requests_total{route=\"%s\",status=\"other\"} %llu\n",
                                 srv_route_name((srv_route)r), v);
        }
    ok = ok && met__printf(&b, "# HELP kvseal_rejections_total Requests turned away before "
                               "generation, by reason.\n# TYPE kvseal_rejections_total counter\n");
    for (int r = ADMIT_OK + 1; r < ADMIT__COUNT && ok; r++)
        ok = !admit_reason_is_refusal((uint32_t)r) || // failures after admission: not here
             met__printf(&b, "kvseal_rejections_total{reason=\"%s\"} %llu\n",
                         admit_reason_info((admit_reason)r)->name, LOAD(m->rejections[r]));
    ok = ok &&
         met__printf(&b,
                     "# HELP kvseal_tokens_in_total Prompt tokens of finished requests.\n"
                     "# TYPE kvseal_tokens_in_total counter\nkvseal_tokens_in_total %llu\n",
                     LOAD(m->tokens_in)) &&
         met__printf(&b,
                     "# HELP kvseal_tokens_out_total Generated tokens.\n"
                     "# TYPE kvseal_tokens_out_total counter\nkvseal_tokens_out_total %llu\n",
                     LOAD(m->tokens_out)) &&
         met__printf(&b,
                     "# HELP kvseal_client_disconnects_total Requests cancelled because the "
                     "client went away.\n# TYPE kvseal_client_disconnects_total counter\n"
                     "kvseal_client_disconnects_total %llu\n",
                     LOAD(m->client_disconnects)) &&
         met__printf(&b,
                     "# HELP kvseal_http_connections Open HTTP connections.\n"
                     "# TYPE kvseal_http_connections gauge\nkvseal_http_connections %lld\n",
                     (long long)atomic_load_explicit(&m->http_connections, memory_order_relaxed)) &&
         met__printf(&b,
                     "# HELP kvseal_generations_inflight Generation requests accepted and not "
                     "yet fully answered (what a drain waits for).\n"
                     "# TYPE kvseal_generations_inflight gauge\nkvseal_generations_inflight %d\n",
                     atomic_load_explicit(&m->inflight, memory_order_relaxed)) &&
         met__printf(&b,
                     "# HELP kvseal_http_probes_total Interim 102 answers sent to clients that "
                     "half-closed before their answer (a vanished one then resets).\n"
                     "# TYPE kvseal_http_probes_total counter\nkvseal_http_probes_total %llu\n",
                     LOAD(m->http_probes)) &&
         met__hist(&b, "kvseal_ttft_seconds", "Time from submission to the first token.",
                   &m->ttft) &&
         met__hist(&b, "kvseal_tpot_seconds", "Time per output token after the first.", &m->tpot) &&
         met__hist(&b, "kvseal_e2e_request_latency_seconds",
                   "Time from submission to the answer's last event.", &m->e2e) &&
         met__hist(&b, "kvseal_request_queue_time_seconds",
                   "Time from submission until the request left the wait queue.", &m->queue) &&
         met__printf(&b,
                     "# HELP kvseal_online Whether the model accepts new requests.\n"
                     "# TYPE kvseal_online gauge\nkvseal_online %d\n",
                     online ? 1 : 0);
    if (es && ok) {
        static const char *const states[4] = {"free", "allocated", "ready", "quarantine"};
        ok = met__printf(&b, "# HELP kvseal_kv_pages KV pool pages by state.\n"
                             "# TYPE kvseal_kv_pages gauge\n");
        for (int i = 0; i < 4 && ok; i++)
            ok = met__printf(&b, "kvseal_kv_pages{state=\"%s\"} %u\n", states[i], es->kv.pages[i]);
        ok = ok &&
             met__printf(&b,
                         "# HELP kvseal_isolation_violations_total Sequences stopped by a KV "
                         "page check (I1), counted once per sequence.\n"
                         "# TYPE kvseal_isolation_violations_total counter\n"
                         "kvseal_isolation_violations_total %llu\n",
                         (unsigned long long)es->n_violations) &&
             met__printf(&b,
                         "# HELP kvseal_prefix_cache_hit_pages_total KV pages reused from "
                         "the tenant-scoped prefix cache.\n"
                         "# TYPE kvseal_prefix_cache_hit_pages_total counter\n"
                         "kvseal_prefix_cache_hit_pages_total %llu\n",
                         (unsigned long long)es->kv.prefix_hits_pages) &&
             met__printf(&b,
                         "# HELP kvseal_prefix_cache_pages KV pages held by the prefix "
                         "cache (recurrent-state snapshots included).\n# TYPE kvseal_prefix_cache_pages gauge\n"
                         "kvseal_prefix_cache_pages %llu\n",
                         (unsigned long long)es->kv.prefix_cached_pages) &&
             met__printf(&b,
                         "# HELP kvseal_queue_requests Admitted requests waiting for room.\n"
                         "# TYPE kvseal_queue_requests gauge\nkvseal_queue_requests %u\n",
                         es->n_queued) &&
             met__printf(&b,
                         "# HELP kvseal_running_requests Sequences in the running batch.\n"
                         "# TYPE kvseal_running_requests gauge\nkvseal_running_requests %u\n",
                         es->n_running) &&
             met__printf(&b,
                         "# HELP kvseal_paused_requests Running requests held back because "
                         "their client is not reading (output backlog full).\n"
                         "# TYPE kvseal_paused_requests gauge\nkvseal_paused_requests %u\n",
                         es->n_paused) &&
             met__printf(&b,
                         "# HELP kvseal_kv_page_allocations_total KV pages handed out "
                         "(FREE -> ALLOCATED) since start.\n"
                         "# TYPE kvseal_kv_page_allocations_total counter\n"
                         "kvseal_kv_page_allocations_total %llu\n",
                         (unsigned long long)es->kv.allocations) &&
             met__printf(&b,
                         "# HELP kvseal_engine_requests_total Engine requests by outcome.\n"
                         "# TYPE kvseal_engine_requests_total counter\n"
                         "kvseal_engine_requests_total{outcome=\"finished\"} %llu\n"
                         "kvseal_engine_requests_total{outcome=\"aborted\"} %llu\n"
                         "kvseal_engine_requests_total{outcome=\"rejected\"} %llu\n",
                         (unsigned long long)es->n_finished, (unsigned long long)es->n_aborted,
                         (unsigned long long)es->n_rejected);
        uint64_t total = 0;
        for (int i = 0; i < 4; i++)
            total += es->kv.pages[i];
        ok = ok && met__printf(&b,
                               "# HELP kvseal_kv_usage_ratio KV pool pages not free, as a "
                               "fraction of the pool (0..1).\n"
                               "# TYPE kvseal_kv_usage_ratio gauge\nkvseal_kv_usage_ratio %.6f\n",
                               total ? 1.0 - (double)es->kv.pages[0] / (double)total : 0.0);
        // speculative decoding (docs/speculative.md); vLLM's names below too
        ok = ok &&
             met__printf(&b,
                         "# HELP kvseal_spec_verify_steps_total Request-steps that carried "
                         "speculative drafts.\n# TYPE kvseal_spec_verify_steps_total counter\n"
                         "kvseal_spec_verify_steps_total %llu\n"
                         "# HELP kvseal_spec_draft_tokens_total Draft tokens computed.\n"
                         "# TYPE kvseal_spec_draft_tokens_total counter\n"
                         "kvseal_spec_draft_tokens_total %llu\n",
                         (unsigned long long)es->spec_steps, (unsigned long long)es->spec_drafted) &&
             met__printf(&b,
                         "# HELP kvseal_spec_accepted_tokens_total Draft tokens kept (the "
                         "rest were scrubbed at once).\n"
                         "# TYPE kvseal_spec_accepted_tokens_total counter\n"
                         "kvseal_spec_accepted_tokens_total %llu\n"
                         "# HELP kvseal_spec_acceptance_ratio Draft tokens kept over drafted, "
                         "since start (0 before any draft).\n"
                         "# TYPE kvseal_spec_acceptance_ratio gauge\n"
                         "kvseal_spec_acceptance_ratio %.6f\n",
                         (unsigned long long)es->spec_accepted,
                         es->spec_drafted ? (double)es->spec_accepted / (double)es->spec_drafted
                                          : 0.0) &&
             // LoRA adapters: counts only, never a name (a name is its tenant's)
             met__printf(&b,
                         "# HELP kvseal_lora_adapters LoRA adapters registered.\n"
                         "# TYPE kvseal_lora_adapters gauge\nkvseal_lora_adapters %u\n"
                         "# HELP kvseal_lora_adapter_bytes Memory the adapters' factors hold "
                         "(removed ones still in use included).\n"
                         "# TYPE kvseal_lora_adapter_bytes gauge\nkvseal_lora_adapter_bytes %llu\n"
                         "# HELP kvseal_lora_requests_total Requests admitted with an adapter.\n"
                         "# TYPE kvseal_lora_requests_total counter\n"
                         "kvseal_lora_requests_total %llu\n",
                         es->adapters, (unsigned long long)es->adapter_bytes,
                         (unsigned long long)es->adapter_requests);
    }
    const char *mname = m->model_name ? m->model_name : "model";
    ok = ok &&
         met__printf(&b, "# HELP kvseal_model_info The served model (value 1).\n"
                         "# TYPE kvseal_model_info gauge\n") &&
         met__model_sample(&b, "kvseal_model_info", mname, "1");
    if (m->ts && ok) ok = met__tenants(&b, m->ts);
    ok = ok && met__vllm_all(&b, m, es, mname) && met__process(&b);
    if (!ok) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

// ----------------------------------------------------------------------------
// Security event log

struct server_seclog {
    FILE *f;            /* append-only file or NULL */
    pthread_mutex_t mu; /* serializes lines from several threads */
    atomic_ullong n;
};

ks_err server_seclog_open(const char *path, server_seclog **out, ks_errbuf *eb) {
    *out = NULL;
    server_seclog *l = calloc(1, sizeof *l);
    if (!l) return ks_seterr(eb, KS_ERR_NOMEM, "security log: out of memory");
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l);
        return ks_seterr(eb, KS_ERR_NOMEM, "security log: mutex");
    }
    if (path && !(l->f = fopen(path, "ae"))) {
        ks_err e = ks_seterr(eb, KS_ERR_IO, "security log %s: %s", path, strerror(errno));
        pthread_mutex_destroy(&l->mu);
        free(l);
        return e;
    }
    *out = l;
    return KS_OK;
}

void server_seclog_write(void *ctx, const char *json) {
    server_seclog *l = ctx;
    if (!l || !json) return;
    pthread_mutex_lock(&l->mu);
    // "SECURITY {json}" in a text log; in a json log the event's members join the line
    ks_log_fields(KS_LOG_ERROR, json, "SECURITY %s", json);
    if (l->f) {
        fprintf(l->f, "%s\n", json);
        fflush(l->f);
    }
    atomic_fetch_add_explicit(&l->n, 1, memory_order_relaxed);
    pthread_mutex_unlock(&l->mu);
}

uint64_t server_seclog_count(const server_seclog *l) {
    return l ? (uint64_t)atomic_load_explicit(&((server_seclog *)l)->n, memory_order_relaxed) : 0;
}

void server_seclog_close(server_seclog *l) {
    if (!l) return;
    if (l->f) fclose(l->f);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
