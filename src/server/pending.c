/* pending.c — the pending request an answer waits on (srv_gen): its life
 * (free, notify, suspend, cancel), taking its events from the backend,
 * accounting once it is done, the per-event output pieces (logprobs, SSE
 * chunks) and the errors a failed or refused generation answers with. */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Generation: per-event output

/* Counts the request sc carries in met.inflight (once) until srv__completed:
 * MHD sends a non-streamed answer after its generation is freed. */
void srv__count_inflight(server *s, srv_conn *sc) {
    if (sc->counted) return;
    sc->counted = true;
    atomic_fetch_add_explicit(&s->met.inflight, 1, memory_order_acq_rel);
}

srv_gen *srv__gen_new(server *s, const srv_model *sm, srv_conn *sc, srv_route route,
                      const char *name, int tenant, int64_t reserved) {
    srv_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->s = s;
    g->sm = sm;
    pthread_mutex_init(&g->mu, NULL);
    srv__count_inflight(s, sc);
    g->route = route;
    g->reserved = reserved;
    g->tenant = tenant;
    g->created = (long long)time(NULL);
    g->fd = -1;
    snprintf(g->model, sizeof g->model, "%s", name ? name : srv__model_primary(sm));
    return g;
}

static void srv__gen_release_tenant(srv_gen *g) {
    if (g->tenant < 0) return;
    // never submitted: all of it back; else what was not generated
    int64_t unused = g->ch[0].req ? (int64_t)g->max_tokens * g->n_ch - g->n_gen : g->reserved;
    if (g->route == SRV_ROUTE_EMBEDDINGS) unused = g->embed_ok ? 0 : g->reserved;
    srv_tenants_release_n(g->s->ts, g->tenant, g->n_ch > 1 ? g->n_ch : 1, unused > 0 ? unused : 0);
    g->tenant = -1;
}

/* Frees g once: first out of the sweeper's list, so the sweeper (which
 * cancels under lmu) never reaches a request, an input array or a choice
 * that is being freed. */
void srv__gen_free(srv_gen *g) {
    if (!g) return;
    server *s = g->s;
    pthread_mutex_lock(&s->lmu);
    if (g->lprev)
        g->lprev->lnext = g->lnext;
    else if (s->gens == g)
        s->gens = g->lnext;
    if (g->lnext) g->lnext->lprev = g->lprev;
    g->lprev = g->lnext = NULL;
    pthread_mutex_unlock(&s->lmu);
    for (int i = 0; i < g->n_ch; i++) {
        srv_choice *ch = &g->ch[i];
        if (ch->req) {
            s->b.set_notify(ch->req, NULL, NULL); // no notify runs or starts after this
            if (!ch->done) s->b.cancel(ch->req);
            s->b.release(ch->req);
        }
        srv_buf_free(&ch->text);
        json_decref(ch->lp);
    }
    for (int i = 0; i < g->n_ereq; i++) {
        if (!g->ereq[i]) continue;
        s->b.set_notify(g->ereq[i], NULL, NULL);
        if (!g->edone[i]) s->b.cancel(g->ereq[i]);
        s->b.release(g->ereq[i]);
    }
    free(g->ereq);
    free(g->edone);
    srv_embed_req_free(&g->erq);
    free(g->evec);
    free(g->echo);
    json_decref(g->plp);
    srv__gen_release_tenant(g);
    srv_buf_free(&g->out);
    srv_buf_free(&g->text);
    srv_buf_free(&g->raw);
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    for (int i = 0; i < ENGINE_MAX_N; i++)
        toolcall_parser_destroy(g->ch[i].tc);
    json_decref(g->tc_tools);
    srv_resp_req_free(&g->rx);
    srv_resp_out_free(&g->ro);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* The request's event stream posted an event (the producer's thread, under
 * the stream's lock): resume the connection if it waits, else have the
 * consumer look again before it suspends. */
void srv__gen_notify(void *ctx) {
    srv_gen *g = ctx;
    pthread_mutex_lock(&g->mu);
    if (g->suspended) {
        g->suspended = false;
        MHD_resume_connection(g->conn);
    } else {
        g->wake = true;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Suspends g's connection until the next event, unless one came since the
 * consumer last looked. True: suspended (return and wait to be called
 * again); false: look again now. Only from an MHD callback of g's
 * connection. */
bool srv__gen_suspend(srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool wait = !g->wake;
    g->wake = false;
    if (wait) {
        g->suspended = true;
        MHD_suspend_connection(g->conn);
    }
    pthread_mutex_unlock(&g->mu);
    return wait;
}

/* Cancels every choice still running. The sweeper calls it while the
 * connection's thread takes events and submits inputs: the done flags and
 * the input handles are atomic (a handle is published with release, so its
 * backend request is complete when read here); a request whose done event
 * is taken just after the load is cancelled harmlessly. */
void srv__gen_cancel(srv_gen *g) {
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].req && !atomic_load_explicit(&g->ch[i].done, memory_order_relaxed))
            g->s->b.cancel(g->ch[i].req);
    for (int i = 0; i < g->n_ereq; i++) {
        void *r = atomic_load_explicit(&g->ereq[i], memory_order_acquire);
        if (r && !atomic_load_explicit(&g->edone[i], memory_order_relaxed)) g->s->b.cancel(r);
    }
}

/* Takes the next event of any choice if there is one (round robin, so no
 * choice starves the others), without waiting: 1 an event in *ev, its
 * choice in g->cur; 0 none yet; -1 a choice's events ended without a done
 * event. ev->done ends that choice; g->done is set once every choice's
 * done event was taken. */
int srv__gen_poll(srv_gen *g, engine_event *ev) {
    for (int k = 0; k < g->n_ch; k++) {
        int i = (g->rr + k) % g->n_ch;
        srv_choice *ch = &g->ch[i];
        if (ch->done) continue;
        ks_err e = g->s->b.next(ch->req, ev, 0);
        if (e == KS_ERR_TIMEOUT) continue;
        g->cur = i;
        g->rr = i + 1;
        if (e != KS_OK) {
            atomic_store_explicit(&ch->done, true, memory_order_relaxed);
            g->done = true;
            return -1;
        }
        bool gen = ev->token >= 0 && !ev->prompt;
        if (gen && !g->t_first_ns) g->t_first_ns = ks_now_ns();
        if (gen) {
            ch->n_gen++;
            g->n_gen++;
            ch->lp_sum += (double)ev->sr.logprob;
        }
        if (gen && g->n_stops && !g->raw_oom) { // which stop ended it (srv__anth_stop_seq)
            char piece[256];
            size_t n = tok_piece(g->sm->vocab, ev->token, false, piece, sizeof piece);
            g->raw_oom = !srv_buf_add(&g->raw, piece, n < sizeof piece ? n : sizeof piece);
        }
        if (ev->done) {
            atomic_store_explicit(&ch->done, true, memory_order_relaxed);
            ch->end = *ev;
            g->n_gen += ev->n_gen - ch->n_gen; // the engine's count is the truth
            ch->n_gen = ev->n_gen;
            g->n_drafted += ev->n_drafted;
            g->n_accepted += ev->n_accepted;
            if (g->tenant >= 0) { // its grammar's CPU and its drafts, its tenant's
                srv_tenant *t = &g->s->ts->t[g->tenant];
                atomic_fetch_add_explicit(&t->m_mask_us, (unsigned long long)(ev->mask_ms * 1e3),
                                          memory_order_relaxed);
                atomic_fetch_add_explicit(&t->m_spec_drafted, (unsigned long long)ev->n_drafted,
                                          memory_order_relaxed);
                atomic_fetch_add_explicit(&t->m_spec_accepted,
                                          (unsigned long long)ev->n_accepted, memory_order_relaxed);
            }
            g->done = ++g->n_done == g->n_ch;
        }
        return 1;
    }
    return 0;
}

/* The request's outcome over its choices: ev (a done event) with the
 * completion tokens of every choice and the prompt counted once. */
engine_event srv__gen_total(const srv_gen *g, const engine_event *ev) {
    engine_event t = *ev;
    t.n_gen = g->n_gen;
    t.n_drafted = g->n_drafted;
    t.n_accepted = g->n_accepted;
    return t;
}

/* The HTTP status the request's answer has (or had): 200 once it finished
 * or its stream's head went out, else the status of the error it gets. */
static int srv__gen_status(const srv_gen *g, const engine_event *ev) {
    if (srv_finish_name(ev->finish) || (g->stream && g->head_sent)) return 200;
    srv_error err;
    if (atomic_load(&g->gone) && ev->state != ENGINE_FINISHED)
        srv__gone_error(g->s, &err);
    else
        srv__gen_error(g, ev, &err);
    return err.status;
}

/* The request's one completion line: text as before, or with --log-format
 * json its fields as members of the line's object (built by jansson, so
 * every string is escaped). Counts, names and times only: never the
 * prompt's or the output's text (log_content writes that apart). */
static void srv__gen_log(const srv_gen *g, const engine_event *ev, const char *tenant,
                         double ttft_ms, double duration_ms) {
    // the ids hold the client's x-request-id: log values, never raw text
    char id[4 * sizeof g->id + 3], rid[4 * sizeof g->rid + 3], em[4 * sizeof ev->errmsg + 3];
    srv_log_value(g->id, id, sizeof id);
    srv_log_value(g->rid, rid, sizeof rid);
    // an error may quote what the request or a worker sent: a value too
    srv_log_value(ev->errmsg, em, sizeof em);
    const char *fin = srv_finish_name(ev->finish);
    if (!fin) fin = ev->finish == ENGINE_FINISH_ABORT ? "abort" : "error";
    json_t *f =
        json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:f}", "request_id", g->rid,
                  "tenant", tenant, "route", srv_route_name(g->api), "model", g->model, "status",
                  srv__gen_status(g, ev), "prompt_tokens", (int)ev->n_prompt, "cached_tokens",
                  (int)ev->n_cached, "completion_tokens", (int)ev->n_gen, "finish_reason", fin,
                  "duration_ms", duration_ms);
    if (f) {
        json_object_set_new(f, "ttft_ms", ttft_ms >= 0 ? json_real(ttft_ms) : json_null());
        if (ev->errmsg[0]) json_object_set_new(f, "error", json_string(em));
    }
    // 7 significant digits: the milliseconds to the microsecond, no binary noise
    char *fields = f ? json_dumps(f, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
    json_decref(f);
    ks_log_fields(KS_LOG_INFO, fields,
                  "request %s: %s, %d prompt tokens (%d cached), %d generated, finish %d%s%s "
                  "request_id=%s",
                  id, srv_route_name(g->api), ev->n_prompt, ev->n_cached, ev->n_gen,
                  (int)ev->finish, ev->errmsg[0] ? ": " : "", ev->errmsg[0] ? em : "", rid);
    free(fields);
}

/* Metrics and tenant refund once the done event arrived; the connection's
 * idle timeout, suspended while generating, applies again (MHD restarts
 * the idle clock when a timeout is set on a connection that had none). */
void srv__gen_account(srv_gen *g, const engine_event *ev) {
    server *s = g->s;
    if (g->conn)
        MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_timeout_s);
    atomic_fetch_add_explicit(&s->met.tokens_in, (unsigned long long)ev->n_prompt,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.tokens_out, (unsigned long long)ev->n_gen,
                              memory_order_relaxed);
    uint64_t now = ks_now_ns();
    srv_hist_observe(&s->met.e2e, (double)(now - g->t_submit_ns) * 1e-9);
    if (ev->queue_ms >= 0) srv_hist_observe(&s->met.queue, ev->queue_ms * 1e-3);
    srv_metrics_finish(&s->met, ev->finish);
    if (g->tenant >= 0) {
        srv_tenant *t = &s->ts->t[g->tenant];
        atomic_fetch_add_explicit(&t->m_prompt, (unsigned long long)ev->n_prompt,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&t->m_generation, (unsigned long long)ev->n_gen,
                                  memory_order_relaxed);
    }
    if (ev->n_gen > 0 && g->t_first_ns) {
        double ttft =
            ev->ttft_ms > 0 ? ev->ttft_ms * 1e-3 : (double)(g->t_first_ns - g->t_submit_ns) * 1e-9;
        srv_hist_observe(&s->met.ttft, ttft);
        if (ev->n_gen > 1)
            srv_hist_observe(&s->met.tpot,
                             (double)(ks_now_ns() - g->t_first_ns) * 1e-9 / (ev->n_gen - 1));
    }
    const char *tenant = g->tenant >= 0 ? s->ts->t[g->tenant].name : "";
    double ttft_ms = -1;
    if (ev->n_gen > 0 && g->t_first_ns)
        ttft_ms = ev->ttft_ms > 0 ? ev->ttft_ms : (double)(g->t_first_ns - g->t_submit_ns) * 1e-6;
    if (s->log_content) { // opted in by the operator (log_content): a line of its own
        char id[4 * sizeof g->id + 3];
        srv_log_value(g->id, id, sizeof id);
        const srv_buf *t = g->stream ? &g->text : &g->ch[0].text;
        ks_log(KS_LOG_INFO, "request %s output: %.*s", id, (int)t->len, t->p ? t->p : "");
    }
    srv__gen_log(g, ev, tenant, ttft_ms, (double)(now - g->t_submit_ns) * 1e-6);
    srv__gen_release_tenant(g);
}

/* One logprobs entry for a chat answer: {token, logprob, bytes, top_logprobs}. */
json_t *srv__lp_entry(const tok_vocab *v, int32_t id, float lp, bool with_top,
                             const sample_result *sr) {
    char piece[256];
    size_t n = tok_piece(v, id, true, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    json_t *e = json_pack("{s:o, s:f, s:o}", "token", srv__jstr(piece, n), "logprob",
                          isfinite(lp) ? (double)lp : -9999.0, "bytes", bytes);
    if (e && with_top) {
        json_t *top = json_array();
        for (int k = 0; k < sr->n_top; k++)
            json_array_append_new(top,
                                  srv__lp_entry(v, sr->top_ids[k], sr->top_logprobs[k], false, sr));
        json_object_set_new(e, "top_logprobs", top);
    }
    return e;
}

/* Adds ev's token to a completions logprobs object {tokens, token_logprobs,
 * top_logprobs, text_offset}, at text offset *off (advanced). A prompt
 * token (echo) moves the offset by its text without special tokens (BOS is
 * not in the echoed prompt); the first has null logprobs, as OpenAI's. */
void srv__lp_completion(srv_gen *g, json_t *lp, const engine_event *ev, size_t *off) {
    const tok_vocab *v = g->sm->vocab;
    char piece[256];
    size_t n = tok_piece(v, ev->token, true, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    char raw[256];
    size_t adv = ev->prompt ? tok_piece(v, ev->token, false, raw, sizeof raw) : n;
    json_array_append_new(json_object_get(lp, "tokens"), srv__jstr(piece, n));
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*off));
    *off += adv;
    if (ev->no_logprob) {
        json_array_append_new(json_object_get(lp, "token_logprobs"), json_null());
        json_array_append_new(json_object_get(lp, "top_logprobs"), json_null());
        return;
    }
    json_array_append_new(json_object_get(lp, "token_logprobs"),
                          json_real(isfinite(ev->sr.logprob) ? ev->sr.logprob : -9999.0));
    json_t *top = json_object();
    for (int k = 0; k < ev->sr.n_top; k++) {
        char tp[256];
        size_t tn = tok_piece(v, ev->sr.top_ids[k], true, tp, sizeof tp);
        json_t *key = srv__jstr(tp, tn > sizeof tp ? sizeof tp : tn);
        if (key)
            json_object_set_new(
                top, json_string_value(key),
                json_real(isfinite(ev->sr.top_logprobs[k]) ? ev->sr.top_logprobs[k] : -9999.0));
        json_decref(key);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
}

json_t *srv__lp_completion_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The SSE chunk for ev (text and/or logprobs) as choice idx's, NULL when
 * there is nothing. */
json_t *srv__chunk(srv_gen *g, const engine_event *ev, int idx, bool *oom) {
    bool has_lp = g->logprobs && ev->token >= 0;
    if (!ev->text_len && !has_lp) return NULL;
    json_t *text = srv__jstr(ev->text, ev->text_len);
    json_t *j = NULL;
    if (g->route == SRV_ROUTE_WORKERS) {
        j = json_pack("{s:o}", "response", text);
    } else if (g->route == SRV_ROUTE_CHAT) {
        json_t *lp = json_null();
        if (has_lp)
            lp = json_pack("{s:[o]}", "content",
                           srv__lp_entry(g->sm->vocab, ev->token, ev->sr.logprob, true, &ev->sr));
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:o}, s:o, s:n}]}", "id", g->id, "object",
                      "chat.completion.chunk", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "index", idx, "delta", "content", text, "logprobs", lp,
                      "finish_reason");
    } else {
        json_t *lp = json_null();
        if (has_lp) {
            lp = srv__lp_completion_new();
            // a prompt token's offset is the same in every choice; generated
            // ones continue from the end of the prompt
            size_t off = ev->prompt ? g->ptext_off : g->ch[idx].text_off;
            srv__lp_completion(g, lp, ev, &off);
            if (!ev->prompt) g->ch[idx].text_off = off;
        }
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:o, s:i, s:o, s:n}]}", "id", g->id, "object",
                      "text_completion", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "text", text, "index", idx, "logprobs", lp, "finish_reason");
    }
    if (!j) *oom = true;
    return j;
}


/* True for a done event whose error the local engine never reports after
 * admission: a rejection that came with the done event (a cluster's prefill
 * REJECT or decode DENY: state REJECTED), or a failure elsewhere (a lost
 * worker: PEER_CLOSED/IO; a first-token timeout: TIMEOUT other than a
 * queue timeout's FINISH_ABORT; PROTO, ...). These get the status their
 * error implies (srv__done_error). The engine's own (CANCELLED, a queue
 * TIMEOUT, INTERNAL, NOMEM) keep their answers: 503 aborted, 500 failed. */
bool srv__done_mapped(const engine_event *ev) {
    if (ev->state == ENGINE_REJECTED) return true;
    switch (ev->err) {
    case KS_OK:
    case KS_ERR_CANCELLED:
    case KS_ERR_INTERNAL:
    case KS_ERR_NOMEM:
        return false;
    case KS_ERR_TIMEOUT:
        return ev->finish != ENGINE_FINISH_ABORT;
    default:
        return true;
    }
}

/* The answer to a srv__done_mapped event: a refusal by its reason (the
 * table in kvseal/admit.h, as engine_submit's), else PEER_CLOSED and IO 502,
 * TIMEOUT 504, AGAIN 503, anything else 500; the message is the event's. */
void srv__done_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    eb.code = ev->err;
    eb.reason = ev->reason;
    snprintf(eb.msg, sizeof eb.msg, "%s",
             ev->errmsg[0] ? ev->errmsg
             : ev->err     ? ks_strerror(ev->err)
                           : "the request was rejected");
    if (ev->reason) {
        srv__submit_error(ev->err, &eb, g->route, err);
        return;
    }
    switch (ev->err) {
    case KS_ERR_AGAIN:
        srv_refuse(err, ADMIT_WORKER_UNAVAILABLE, NULL, "%s", eb.msg);
        break;
    case KS_ERR_PEER_CLOSED:
    case KS_ERR_IO:
        srv_refuse(err, ADMIT_UPSTREAM_ERROR, NULL, "%s", eb.msg);
        break;
    case KS_ERR_TIMEOUT:
        srv_refuse(err, ADMIT_UPSTREAM_TIMEOUT, NULL, "%s", eb.msg);
        break;
    default:
        srv_fail(err, 500, "internal_error", "%s", eb.msg);
    }
}

/* Error details of an aborted/failed request, in the route's shape. */
void srv__gen_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    // a drain that ran out aborts with CANCELLED (set_online); other aborts
    // during a drain (a queue timeout, a lost worker) keep their own error
    bool shut = atomic_load_explicit(&g->s->draining, memory_order_acquire) &&
                ev->finish == ENGINE_FINISH_ABORT && ev->err == KS_ERR_CANCELLED;
    if ((g->gone && atomic_load(&g->s->stopping)) || shut)
        srv_refuse(err, ADMIT_SHUTDOWN_ABORTED, NULL, NULL);
    else if (srv__done_mapped(ev))
        srv__done_error(g, ev, err);
    else if (ev->finish == ENGINE_FINISH_ABORT)
        srv_refuse(err, ADMIT_RUN_ABORTED, NULL, "the request was aborted: %s",
                   ev->errmsg[0] ? ev->errmsg : "model taken offline or queue timeout");
    else
        srv_fail(err, 500, "internal_error", "the request failed: %s",
                 ev->errmsg[0] ? ev->errmsg : ks_strerror(ev->err));
}


/* Maps a backend's refusal to the client's error: the reason the refusing
 * process put in eb (kvseal/admit.h) gives status and code, its message is
 * the client's; an error that is not a refusal is a 500. */
void srv__submit_error(ks_err e, const ks_errbuf *eb, srv_route route, srv_error *err) {
    admit_reason r = (admit_reason)eb->reason;
    if (r == ADMIT_OK || r >= ADMIT__COUNT) {
        srv_fail(err, 500, "internal_error", "cannot start the request: %s",
                 eb->msg[0] ? eb->msg : ks_strerror(e));
        return;
    }
    const char *pparam = route == SRV_ROUTE_COMPLETIONS  ? "prompt"
                         : route == SRV_ROUTE_EMBEDDINGS ? "input"
                                                         : "messages";
    if (r == ADMIT_ADAPTER_NOT_FOUND) pparam = "adapter";
    srv_refuse(err, r,
               r == ADMIT_CONTEXT_LENGTH || r == ADMIT_KV_CAPACITY || r == ADMIT_ADAPTER_NOT_FOUND
                   ? pparam
                   : NULL,
               "%s",
               eb->msg[0] ? eb->msg : admit_reason_info(r)->msg);
}


/* The error of a request whose client is gone: 503 while the server stops,
 * else 499. A vanished client gets nothing (MHD notices when it writes):
 * 499 is for the log and metrics. */
void srv__gone_error(server *s, srv_error *err) {
    if (atomic_load(&s->stopping))
        srv_refuse(err, ADMIT_SHUTDOWN_ABORTED, NULL, NULL);
    else
        srv_refuse(err, ADMIT_CLIENT_CLOSED, NULL, NULL);
}
