/* mask.c — grammar masks, off the scheduler thread (engine_int.h).
 *
 * A constrained request's draw (grammar_sample: mask, sample, advance) runs
 * as a job on a mask thread, from a copy of its logits row. The step waits
 * for its jobs at most as long as its forward pass took; a request whose
 * job is not done by then sits the next steps out (mpending) and is
 * collected at the start of a later step. The budgets are CPU time of the
 * job's thread, checked when the job is done and, while it runs, at every
 * step: a request over one ends at once (its job runs on and is dropped). */
#include "engine_int.h"

#include "kvseal/admit.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define ENGINE__MASK_NICE 10 // mask threads yield the CPU to the forward pass

/* A mask thread: takes jobs, least-served request first, until stop. */
void *engine__mask_main(void *arg) {
    engine *e = arg;
#ifdef __linux__
    // per-thread niceness (Linux): a grammar's CPU never delays a batch's forward pass
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), ENGINE__MASK_NICE) != 0)
        ks_log(KS_LOG_DEBUG, "mask thread: setpriority: %s", strerror(errno));
#endif
    clockid_t clk = CLOCK_THREAD_CPUTIME_ID;
    if (pthread_getcpuclockid(pthread_self(), &clk) != 0) clk = CLOCK_THREAD_CPUTIME_ID;
    pthread_mutex_lock(&e->mmu);
    for (;;) {
        while (!e->mq_head && !e->mstop)
            pthread_cond_wait(&e->mcv, &e->mmu);
        if (e->mstop) break; // what is still queued is dropped by engine__free
        // the job of the request whose masks have cost least so far (FIFO
        // among equals): a cheap grammar's draw never waits behind an
        // expensive one's, whoever queued first
        engine_req *r = e->mq_head, *before = NULL;
        for (engine_req *q = e->mq_head, *p = NULL; q; p = q, q = q->mnext)
            if (q->mask_ns < r->mask_ns) r = q, before = p;
        if (before) before->mnext = r->mnext;
        else e->mq_head = r->mnext;
        if (e->mq_tail == r) e->mq_tail = before;
        r->mnext = NULL;
        r->mclk = clk;
        r->mcpu0 = engine__clock_ns(clk);
        atomic_store(&r->mstate, ENGINE__MASK_RUNNING);
        pthread_mutex_unlock(&e->mmu);
        // a request that already ended (cancelled, over its budget) is not worked on
        engine_state st = engine_req_state(r);
        if (st != ENGINE_FINISHED && st != ENGINE_ABORTED) {
            ks_errbuf eb;
            ks_errbuf_clear(&eb);
            r->mend = false;
            r->merr = grammar_sample(r->gm, e->gvocab, r->smp, &r->sp, r->mlogits, r->gmask,
                                     &r->msr, &r->mend, &eb);
            if (r->merr) {
                r->mreason = eb.reason;
                snprintf(r->mmsg, sizeof r->mmsg, "%s", eb.msg);
            }
        }
        uint64_t c1 = engine__clock_ns(clk);
        pthread_mutex_lock(&e->mmu);
        r->mlast_ns = c1 > r->mcpu0 ? c1 - r->mcpu0 : 0;
        r->mask_ns += r->mlast_ns;
        atomic_store(&r->mstate, ENGINE__MASK_DONE);
        pthread_cond_broadcast(&e->mdone);
        pthread_mutex_unlock(&e->mmu);
        engine__wake(e); // the scheduler may sleep with nothing else to run
        engine__req_unref(r);
        pthread_mutex_lock(&e->mmu);
    }
    pthread_mutex_unlock(&e->mmu);
    return NULL;
}

/* The scheduler's token trie, built at the first constrained step. False
 * (r finished with an error) on out-of-memory. */
static bool engine__grammar_vocab(engine *e, engine_req *r) {
    if (e->gvocab) return true;
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    if (grammar_vocab_create(e->vocab, &e->gvocab, &eb) != KS_OK) {
        engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_NOMEM,
                       "out of memory for the grammar's token trie");
        return false;
    }
    return true;
}

/* Queues r's draw from logits_row (copied). Returns true if r finished
 * instead (no token trie: out of memory). */
bool engine__mask_post(engine *e, engine_req *r, const float *logits_row) {
    if (!engine__grammar_vocab(e, r)) return true;
    memcpy(r->mlogits, logits_row, sizeof(float) * (size_t)e->V);
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); // the job's
    r->mpending = true;
    r->mstep = e->n_steps;
    pthread_mutex_lock(&e->mmu);
    atomic_store(&r->mstate, ENGINE__MASK_QUEUED);
    if (e->mq_tail) e->mq_tail->mnext = r;
    else e->mq_head = r;
    e->mq_tail = r;
    pthread_cond_signal(&e->mcv);
    pthread_mutex_unlock(&e->mmu);
    return false;
}

/* Ends r for going over a mask budget (a 400 naming the limit). */
static void engine__mask_over(engine *e, engine_req *r, bool per_token, uint64_t ns) {
    char msg[256];
    if (per_token)
        snprintf(msg, sizeof msg,
                 "the grammar's mask took %.1f ms of CPU for one token, over this server's limit "
                 "of %g ms (--grammar-budget-ms); simplify the grammar",
                 (double)ns / 1e6, (double)e->o.grammar_budget_us / 1e3);
    else
        snprintf(msg, sizeof msg,
                 "the grammar's masks took %.1f ms of CPU in all, over this server's limit of %g "
                 "ms per request (--grammar-cpu-ms); simplify the grammar or lower max_tokens",
                 (double)ns / 1e6, (double)e->o.grammar_cpu_us / 1e3);
    ks_log(KS_LOG_WARN, "request %" PRIu64 " (tenant %s): %s", r->id, r->tenant, msg);
    engine__finish_reason(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INVAL, ADMIT_INVALID,
                          msg);
}

/* A done job's result: the budgets, then the token as engine__take handles
 * it; ends the request once the grammar can accept nothing more. Returns
 * true if r finished. */
static bool engine__mask_take(engine *e, engine_req *r, uint64_t last_ns, uint64_t total_ns) {
    const uint64_t us = 1000ull; // budgets are in microseconds, CPU clocks in nanoseconds
    if (e->o.grammar_budget_us && last_ns > e->o.grammar_budget_us * us) {
        engine__mask_over(e, r, true, last_ns);
        return true;
    }
    if (e->o.grammar_cpu_us && total_ns > e->o.grammar_cpu_us * us) {
        engine__mask_over(e, r, false, total_ns);
        return true;
    }
    if (r->merr != KS_OK) { // a grammar no token can continue is the request's fault (400)
        engine__finish_reason(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, r->merr, r->mreason,
                              r->mmsg);
        return true;
    }
    if (r->mend) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    if (engine__take(e, r, &r->msr)) return true;
    if (grammar_matcher_done(r->gm)) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    return false;
}

/* Collects the running set's done jobs (their tokens) and ends requests
 * whose running job is already over a budget; finished requests leave the
 * running set. */
void engine__mask_collect(engine *e) {
    enum { KEEP, TAKE, OVER_TOKEN, OVER_TOTAL };
    uint8_t *act = e->m_act;
    uint64_t *last = e->m_last, *total = e->m_total;
    const uint64_t us = 1000ull; // budgets are in microseconds, CPU clocks in nanoseconds
    bool any = false;
    pthread_mutex_lock(&e->mmu);
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        act[i] = KEEP;
        if (!r->mpending) continue;
        int st = atomic_load(&r->mstate);
        if (st == ENGINE__MASK_DONE) {
            atomic_store(&r->mstate, ENGINE__MASK_IDLE);
            act[i] = TAKE;
            last[i] = r->mlast_ns;
            total[i] = r->mask_ns;
        } else if (st == ENGINE__MASK_RUNNING) {
            uint64_t now = engine__clock_ns(r->mclk);
            last[i] = now > r->mcpu0 ? now - r->mcpu0 : 0;
            total[i] = r->mask_ns + last[i];
            if (e->o.grammar_budget_us && last[i] > e->o.grammar_budget_us * us) act[i] = OVER_TOKEN;
            else if (e->o.grammar_cpu_us && total[i] > e->o.grammar_cpu_us * us)
                act[i] = OVER_TOTAL;
        }
        any |= act[i] != KEEP;
    }
    pthread_mutex_unlock(&e->mmu);
    if (!any) return;
    int kept = 0, n_run = e->n_running;
    for (int i = 0; i < n_run; i++) {
        engine_req *r = e->running[i];
        bool gone = false;
        if (act[i] == TAKE) {
            r->mpending = false;
            gone = engine__mask_take(e, r, last[i], total[i]);
        } else if (act[i] != KEEP) {
            engine__mask_over(e, r, act[i] == OVER_TOKEN, act[i] == OVER_TOKEN ? last[i] : total[i]);
            gone = true;
        }
        if (!gone) e->running[kept++] = r;
    }
    e->n_running = kept;
    atomic_store(&e->st_running, (unsigned)kept);
}

/* Waits until every job of the running set that this step posted is done
 * (any: one job of any step), or until deadline_ns (ks_now_ns clock). A job
 * of an earlier step that is still running is an expensive one: waiting
 * for it again would only slow the others. */
void engine__mask_wait(engine *e, uint64_t deadline_ns, bool any) {
    pthread_mutex_lock(&e->mmu);
    for (;;) {
        int n_pending = 0, n_done = 0;
        for (int i = 0; i < e->n_running; i++) {
            engine_req *r = e->running[i];
            if (!r->mpending || (!any && r->mstep != e->n_steps)) continue;
            if (atomic_load(&r->mstate) == ENGINE__MASK_DONE) n_done++;
            else n_pending++;
        }
        uint64_t now = ks_now_ns();
        if (!n_pending || (any && n_done) || now >= deadline_ns) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (deadline_ns - now);
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&e->mdone, &e->mmu, &ts);
    }
    pthread_mutex_unlock(&e->mmu);
}
