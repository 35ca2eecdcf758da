/* stream.c — a request's event stream (engine.h, "Event streams"): the
 * events one producer posts and one consumer pulls, plus the detokenizer
 * and stop-string matcher that turn tokens into the text those events carry.
 * Shared by the engine's scheduler and the cluster router, so a client sees
 * the same events from `kvseal serve` and from `kvseal router`. */
#include "kvseal/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct engine_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    engine_event *ev; /* ring of cap events */
    size_t head, n, cap;
    bool done_posted, done_taken;
    bool wake_armed;                 /* engine_stream_backlogged said true */
    void (*wake)(void *ctx);
    void *wake_ctx;
    void (*notify)(void *ctx); /* consumer's (mu) */
    void *notify_ctx;
    tok_stream ts;  /* producer side only */
    stop_matcher *stop;
    int32_t n_tok, min_tokens; /* producer side: tokens so far; stops apply from min_tokens on */
};

ks_err engine_stream_create(const char *const *stops, int n_stops, engine_stream **out, ks_errbuf *eb) {
    *out = NULL;
    engine_stream *s = calloc(1, sizeof *s);
    if (!s) return ks_seterr(eb, KS_ERR_NOMEM, "event stream");
    ks_err e = stop_matcher_create(stops, n_stops, &s->stop, eb);
    if (e) {
        free(s);
        return e;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    tok_stream_init(&s->ts);
    *out = s;
    return KS_OK;
}

void engine_stream_destroy(engine_stream *s) {
    if (!s) return;
    stop_matcher_destroy(s->stop);
    free(s->ev);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void engine_stream_post(engine_stream *s, const engine_event *ev) {
    pthread_mutex_lock(&s->mu);
    if (s->n == s->cap) {  // grow the ring (keeps order)
        size_t cap = s->cap ? s->cap * 2 : 8;
        engine_event *nv = malloc(sizeof *nv * cap);
        if (!nv) {  // out of memory: drop text events, never the done event
            pthread_mutex_unlock(&s->mu);
            KS_ASSERT(!ev->done);
            return;
        }
        for (size_t i = 0; i < s->n; i++) nv[i] = s->ev[(s->head + i) % s->cap];
        free(s->ev);
        s->ev = nv;
        s->head = 0;
        s->cap = cap;
    }
    s->ev[(s->head + s->n) % s->cap] = *ev;
    s->n++;
    if (ev->done) s->done_posted = true;
    pthread_cond_signal(&s->cv);
    if (s->notify) s->notify(s->notify_ctx);
    pthread_mutex_unlock(&s->mu);
}

ks_err engine_stream_next(engine_stream *s, engine_event *ev, uint32_t timeout_ms) {
    pthread_mutex_lock(&s->mu);
    if (s->done_taken) {
        pthread_mutex_unlock(&s->mu);
        return KS_ERR_CANCELLED;
    }
    if (s->n == 0 && timeout_ms) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        while (s->n == 0)
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) break;
    }
    if (s->n == 0) {
        pthread_mutex_unlock(&s->mu);
        return KS_ERR_TIMEOUT;
    }
    *ev = s->ev[s->head];
    s->head = (s->head + 1) % s->cap;
    s->n--;
    if (ev->done) s->done_taken = true;
    bool wake = s->wake_armed && s->n <= ENGINE_STREAM_BACKLOG / 2;
    if (wake) s->wake_armed = false;
    pthread_mutex_unlock(&s->mu);
    if (wake && s->wake) s->wake(s->wake_ctx);
    return KS_OK;
}

bool engine_stream_done_posted(engine_stream *s) {
    pthread_mutex_lock(&s->mu);
    bool d = s->done_posted;
    pthread_mutex_unlock(&s->mu);
    return d;
}

bool engine_stream_backlogged(engine_stream *s) {
    pthread_mutex_lock(&s->mu);
    bool full = s->n >= ENGINE_STREAM_BACKLOG;
    if (full) s->wake_armed = true;
    pthread_mutex_unlock(&s->mu);
    return full;
}

void engine_stream_set_notify(engine_stream *s, void (*notify)(void *ctx), void *ctx) {
    pthread_mutex_lock(&s->mu);
    s->notify = notify;
    s->notify_ctx = ctx;
    pthread_mutex_unlock(&s->mu);
}

void engine_stream_set_wake(engine_stream *s, void (*wake)(void *ctx), void *ctx) {
    s->wake = wake;
    s->wake_ctx = ctx;
}

/* Posts text split into ENGINE_TEXT_CAP events on UTF-8 boundaries; the
 * token (and its logprobs) goes with the first. */
static void stream__post_text(engine_stream *s, int32_t token, const sample_result *sr,
                              const char *text, size_t len) {
    engine_event ev;
    memset(&ev, 0, offsetof(engine_event, text));
    ev.token = token;
    if (sr) ev.sr = *sr;
    do {
        size_t n = len < ENGINE_TEXT_CAP ? len : ENGINE_TEXT_CAP;
        // never split inside a UTF-8 sequence
        while (n < len && n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80) n--;
        if (n == 0 && len > 0) n = len < ENGINE_TEXT_CAP ? len : ENGINE_TEXT_CAP;  // not UTF-8: cut anyway
        if (n) {  // text may be NULL when len is 0
            memcpy(ev.text, text, n);
            text += n;
            len -= n;
        }
        ev.text_len = n;
        engine_stream_post(s, &ev);
        ev.token = -1;
    } while (len > 0);
}

ks_err engine_stream_token(engine_stream *s, const tok_vocab *v, const sample_result *sr, char *piece,
                           size_t cap, bool *matched) {
    *matched = false;
    size_t n = tok_stream_push(&s->ts, v, sr->token, piece, cap);
    if (++s->n_tok < s->min_tokens) { // min_tokens: no stop string yet (nothing is held back)
        stream__post_text(s, sr->token, sr, piece, n);
        return KS_OK;
    }
    stop_result st = {0};
    if (stop_matcher_push(s->stop, piece, n, &st) != KS_OK) return KS_ERR_NOMEM;
    stream__post_text(s, sr->token, sr, st.text, st.len);
    *matched = st.matched;
    return KS_OK;
}

void engine_stream_set_min_tokens(engine_stream *s, int32_t min_tokens) {
    s->min_tokens = min_tokens;
}

void engine_stream_finish(engine_stream *s, const engine_outcome *o, char *piece, size_t cap) {
    if (o->finish == ENGINE_FINISH_STOP || o->finish == ENGINE_FINISH_LENGTH)
        engine_stream_flush(s, piece, cap);
    engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.done = true;
    ev.token = -1;
    ev.finish = o->finish;
    ev.state = o->state;
    ev.err = o->err;
    ev.reason = o->reason;
    if (o->msg) snprintf(ev.errmsg, sizeof ev.errmsg, "%s", o->msg);
    ev.n_prompt = o->n_prompt;
    ev.n_gen = o->n_gen;
    ev.n_cached = o->n_cached;
    ev.n_drafted = o->n_drafted;
    ev.n_accepted = o->n_accepted;
    ev.ttft_ms = o->t_first_ns ? (double)(o->t_first_ns - o->t_submit_ns) / 1e6 : 0.0;
    ev.queue_ms = o->t_sched_ns && o->t_sched_ns >= o->t_submit_ns
                      ? (double)(o->t_sched_ns - o->t_submit_ns) / 1e6
                      : -1.0;
    ev.mask_ms = (double)o->mask_ns / 1e6;
    engine_stream_post(s, &ev);
}

void engine_stream_flush(engine_stream *s, char *piece, size_t cap) {
    size_t n = tok_stream_flush(&s->ts, piece, cap);
    stop_result sr = {0};
    if (stop_matcher_push(s->stop, piece, n, &sr) == KS_OK && sr.len)
        stream__post_text(s, -1, NULL, sr.text, sr.len);
    if (!sr.matched) {
        stop_matcher_flush(s->stop, &sr);
        if (sr.len) stream__post_text(s, -1, NULL, sr.text, sr.len);
    }
}
