/* pool.c — the persistent compute thread pool.
 *
 * Workers are started once and woken for every op: the owner bumps a
 * generation counter, workers spin briefly on it and then sleep on a condition
 * variable. Each op is split by (ith, nth) inside the task function; the pool
 * itself never looks at the work. Completion is a countdown the owner waits
 * on, so there is a full barrier between consecutive ks_pool_run calls. */
#include "kvseal/base.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define KS_POOL_SPIN 5000  // polls before a worker sleeps (~0.3 ms)

struct ks_pool {
    int nth;                    // threads including the owner (thread 0)
    pthread_t *threads;         // (nth-1)
    pthread_mutex_t mu;
    pthread_cond_t cv;          // signalled when gen changes
    atomic_uint gen;            // bumped by the owner for each op
    atomic_int pending;         // workers still running the current op
    atomic_bool stop;
    ks_pool_fn fn;              // current op; written before gen is bumped
    void *arg;
};

typedef struct {
    ks_pool *p;
    int ith;
} pool__worker_arg;

static void *pool__worker(void *v) {
    pool__worker_arg wa = *(pool__worker_arg *)v;
    free(v);
    ks_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < KS_POOL_SPIN) {
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_acquire))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        p->fn(p->arg, wa.ith, p->nth);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

ks_pool *ks_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    ks_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) goto fail;
    for (int i = 1; i < n_threads; i++) {
        pool__worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto fail_threads;
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, pool__worker, wa) != 0) {
            free(wa);
            goto fail_threads;
        }
        continue;
    fail_threads:
        p->nth = i;  // join only the ones that started
        ks_pool_destroy(p);
        return NULL;
    }
    return p;
fail:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
}

void ks_pool_run(ks_pool *p, ks_pool_fn fn, void *arg) {
    if (p->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->nth - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->nth);
    // spin, then yield: with more threads than cores a pure spin starves the
    // very workers it waits for
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; spins++) {
        if (spins < KS_POOL_SPIN) __builtin_ia32_pause();
        else sched_yield();
    }
}

int ks_pool_nth(const ks_pool *p) { return p->nth; }

void ks_pool_destroy(ks_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, true, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nth; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
