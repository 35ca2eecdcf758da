/* limits_redis.c — tenant rate limits shared by every router of a fleet
 * through redis (hiredis; docs/cluster.md "Tenant limits across routers").
 *
 * Each tenant's token and request buckets live in one redis hash,
 * PREFIX "tenant:" NAME, fields tok, req and ts (the redis server's clock in
 * microseconds, so routers need no common clock). One Lua script, loaded
 * once and run with EVALSHA, refills both buckets for the time elapsed and
 * takes (or, forced, gives back) tokens and requests atomically: two
 * routers can never both spend the last tokens. The key expires two
 * minutes after its last use (a full refill takes one).
 *
 * One connection, used under srv_tenants.mu (the callers hold it). A
 * failure (connect, timeout, an error reply) closes it and reports
 * KS_ERR_IO; the caller then falls back to its local share of the limit
 * (tenants.c) and the next attempt to reconnect waits a second. */
#include "server_int.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RL_TIMEOUT_MS 200
#define RL_RETRY_MS 1000

/* KEYS[1] the bucket; ARGV tpm, rpm, mode (0: take only when there is
 * enough, 1: add the (signed) amounts whatever the level), tokens, requests.
 * A limit of 0 is unlimited: its bucket is neither checked nor changed.
 * Returns {taken (0/1), tokens available, requests available} (as strings:
 * redis truncates Lua numbers to integers). */
static const char RL_SCRIPT[] =
    "local tpm, rpm = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local mode, dt, dr = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local v = redis.call('HMGET', KEYS[1], 'tok', 'req', 'ts')\n"
    "local tok, req, ts = tonumber(v[1]) or tpm, tonumber(v[2]) or rpm, tonumber(v[3]) or now\n"
    "local el = (now - ts) / 60000000\n"
    "if el > 0 then\n"
    "  tok = math.min(tpm, tok + el * tpm)\n"
    "  req = math.min(rpm, req + el * rpm)\n"
    "end\n"
    "if tpm == 0 then dt = 0 end\n"
    "if rpm == 0 then dr = 0 end\n"
    "local ok = 1\n"
    "if mode == 0 and ((dr > 0 and req < dr) or (dt > 0 and tok < dt)) then ok = 0 end\n"
    "if ok == 1 then\n"
    "  tok = math.min(tpm, tok - dt)\n"
    "  req = math.min(rpm, req - dr)\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'tok', tostring(tok), 'req', tostring(req), 'ts', "
    "tostring(now))\n"
    "redis.call('PEXPIRE', KEYS[1], 120000)\n"
    "return {ok, tostring(tok), tostring(req)}\n";

struct srv_redis {
    char *host;
    int port;
    char *prefix;
    redisContext *c;       /* NULL while down */
    char sha[41];          /* SCRIPT LOAD's answer for RL_SCRIPT */
    uint64_t next_try_ms;  /* down: no reconnect before this */
    bool down_logged;      /* a warning went out for the current outage */
};

static uint64_t rl__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Closes the connection after a failure and logs the outage once. */
static void rl__down(srv_redis *r, const char *what) {
    if (!r->down_logged)
        ks_log(KS_LOG_WARN, "limits: redis %s:%d unreachable (%s); tenant rate limits fall back "
               "to this process's local share until it is back", r->host, r->port, what);
    r->down_logged = true;
    if (r->c) redisFree(r->c);
    r->c = NULL;
    r->next_try_ms = rl__now_ms() + RL_RETRY_MS;
}

/* Connects and loads the script; false (logged) when redis is unreachable. */
static bool rl__connect(srv_redis *r) {
    if (r->c) return true;
    if (rl__now_ms() < r->next_try_ms) return false;
    struct timeval tv = {.tv_sec = 0, .tv_usec = RL_TIMEOUT_MS * 1000};
    r->c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!r->c || r->c->err) {
        char what[160];
        snprintf(what, sizeof what, "connect: %s", r->c ? r->c->errstr : "out of memory");
        rl__down(r, what);
        return false;
    }
    if (redisSetTimeout(r->c, tv) != REDIS_OK) {
        rl__down(r, "cannot set the command timeout");
        return false;
    }
    redisReply *rep = redisCommand(r->c, "SCRIPT LOAD %s", RL_SCRIPT);
    if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != 40) {
        char what[160];
        snprintf(what, sizeof what, "SCRIPT LOAD: %s",
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : r->c->errstr);
        if (rep) freeReplyObject(rep);
        rl__down(r, what);
        return false;
    }
    memcpy(r->sha, rep->str, 40);
    r->sha[40] = '\0';
    freeReplyObject(rep);
    if (r->down_logged)
        ks_log(KS_LOG_INFO, "limits: redis %s:%d is back; tenant rate limits are shared again",
               r->host, r->port);
    r->down_logged = false;
    return true;
}

ks_err srv_redis_create(const char *host, int port, const char *prefix, srv_redis **out,
                        ks_errbuf *eb) {
    *out = NULL;
    if (!host || !*host || port <= 0 || port > 65535)
        return ks_seterr(eb, KS_ERR_INVAL, "--limits-redis: expected HOST:PORT");
    srv_redis *r = calloc(1, sizeof *r);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "limits: out of memory");
    r->host = strdup(host);
    r->prefix = strdup(prefix ? prefix : "kvseal:");
    r->port = port;
    if (!r->host || !r->prefix) {
        srv_redis_destroy(r);
        return ks_seterr(eb, KS_ERR_NOMEM, "limits: out of memory");
    }
    if (!rl__connect(r))  // not fatal: the limits fall back until redis answers
        ks_log(KS_LOG_WARN, "limits: starting without redis %s:%d", host, port);
    *out = r;
    return KS_OK;
}

void srv_redis_destroy(srv_redis *r) {
    if (!r) return;
    if (r->c) redisFree(r->c);
    free(r->host);
    free(r->prefix);
    free(r);
}

/* A reply element as a number (strings from the script, or an integer). */
static double rl__num(const redisReply *e) {
    if (e->type == REDIS_REPLY_INTEGER) return (double)e->integer;
    if (e->type == REDIS_REPLY_STRING) return strtod(e->str, NULL);
    return 0;
}

ks_err srv_redis_bucket(srv_redis *r, const char *tenant, int64_t tpm, int64_t rpm, bool force,
                        int64_t tokens, int64_t requests, srv_redis_state *out) {
    memset(out, 0, sizeof *out);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!rl__connect(r)) return KS_ERR_IO;
        redisReply *rep = redisCommand(r->c, "EVALSHA %s 1 %stenant:%s %lld %lld %d %lld %lld",
                                       r->sha, r->prefix, tenant, (long long)tpm, (long long)rpm,
                                       force ? 1 : 0, (long long)tokens, (long long)requests);
        if (rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8)) {
            freeReplyObject(rep);  // redis restarted (scripts are not kept): load it again
            redisFree(r->c);
            r->c = NULL;
            continue;
        }
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
            char what[160];
            snprintf(what, sizeof what, "EVALSHA: %s",
                     rep && rep->type == REDIS_REPLY_ERROR ? rep->str
                     : rep                                 ? "unexpected reply"
                                                           : r->c->errstr);
            if (rep) freeReplyObject(rep);
            rl__down(r, what);
            return KS_ERR_IO;
        }
        out->taken = rl__num(rep->element[0]) != 0;
        out->tokens = rl__num(rep->element[1]);
        out->requests = rl__num(rep->element[2]);
        freeReplyObject(rep);
        return KS_OK;
    }
    rl__down(r, "NOSCRIPT after a reload");
    return KS_ERR_IO;
}
