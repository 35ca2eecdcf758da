/* pd.pml — Promela model of the kvseal prefill/decode KV transfer protocol
 * (docs/pd-protocol.md, sections 5-8).
 *
 * Scope: one router (admission + a nondeterministic client), one prefill
 * worker, one decode worker, NR = 2 requests of PPR = 2 pages each, a decode
 * pool of NP = 3 pages. One FIFO channel per connection direction, so
 * messages on different connections reorder by interleaving. KV writes are
 * one-sided (RDMA-like: the write lands in the page when prefill issues it;
 * the KV_PAGE message is only its completion notice), so I5 must come from
 * the protocol, not from a receive-side check.
 *
 * Faults (each bounded so the check stays exhaustive): admission reject,
 * prefill re-validation failure, a faulty prefill that covers fewer tokens
 * than the prompt, client cancel with a duplicated ABORT, decode timeouts,
 * loss of the data link (= teardown: drain + new link epoch), a prefill crash
 * (all its connections lost, its state forgotten).
 *
 * Properties (assertions; spin also reports invalid end states = deadlock,
 * and the router only ends once every page is FREE, so pages stuck in
 * QUARANTINE show up as an invalid end state):
 *   I3  a page is clean when allocated; all pages FREE and clean at the end
 *   I4  no KV write, DONE, commit or token for a rejected request
 *   I5  every write targets a page currently granted to the writer's request
 *       with the grant's generation (never a freed / re-granted page)
 *   I6  commit only if every page holds this request's data at its
 *       generation (its state pages too) and coverage == prompt length
 *   T   every request ends in exactly one terminal state; decode sends
 *       exactly one FINISH per grant; FINISH OK never for a rejected request
 *   R   a request prefill refused ends REJECTED for the reason prefill gave,
 *       whichever of its REJECT and decode's FINISH reaches the router first
 *   M   no page of model A is adopted by (written for, committed to) a request
 *       of model B (issue 40: two models; the decode worker serves model
 *       A = DMODEL, and a faulty router may pair request 1, of model B, with
 *       it once: ADMIT carries the request's model, decode must DENY it)
 *
 * Mutants: build with -DMUTANT_<NAME>, one rule removed each; spin must
 * report a violation (tests/e2e/test_spin.sh):
 *   MUTANT_PLACEHOLDER     prefill rejects but continues with a placeholder
 *   MUTANT_ADMIT_REJECTED  the router marks a request rejected at admission
 *                          but still sends it on (the incident's queue bug)
 *   MUTANT_FREE_BEFORE_ACK decode frees pages on abort without waiting for ACK
 *   MUTANT_NO_COVERAGE     decode commits without the coverage check
 *   MUTANT_NO_STATE_CHECK  decode's completeness check covers the prompt's
 *                          pages only (a state page's frames never arrived:
 *                          decoding would start from the zero state)
 *   MUTANT_NO_SCRUB        pages are not scrubbed on free
 *   MUTANT_NO_EPOCH_CHECK  prefill accepts a grant bound to a dead link and
 *                          sends it on the current one
 *   MUTANT_TIMEOUT_FREE    a decode timeout frees pages without teardown/drain
 *   MUTANT_NO_ACK_UNKNOWN  prefill does not acknowledge an ABORT that overtook
 *                          its PREFILL (pages stay in QUARANTINE: invalid end)
 *   MUTANT_NO_MODEL_CHECK  decode grants an ADMIT whatever its model (issue 40:
 *                          another model's request gets, and adopts, its pages)
 *   MUTANT_FINISH_NO_REASON decode's FINISH after a REJECT does not carry the
 *                          REJECT's reason (before issue 8 section 5: a draining
 *                          prefill's refusal reached the client as a 400 when
 *                          decode's FINISH beat the REJECT to the router)
 *   MUTANT_REVOKE_AFTER_FREE decode frees a grant's pages and revokes its
 *                          remote key only afterwards (a put still in flight
 *                          lands in a FREE or re-granted page)
 *
 * One-sided semantics (issue 40, the UCX data plane): a KV write is a put
 * that prefill ISSUES (write_page) and the fabric LANDS later (Fabric), at
 * any time while the grant's remote key is live; decode creates the key at
 * GRANT and revokes it before the pages are freed (revoke waits until the
 * writer is fenced: after it no put with that key lands). Prefill's DONE
 * follows a flush (every put it issued has landed). I5 is asserted both
 * where a put is issued and where it lands.
 */

#define NR   2      /* requests */
/* A request's grant: NKV prompt pages (each one prompt unit), then NST pages
 * of its recurrent state (hybrid models, kv.h state pages: no prompt unit,
 * sent after the prompt's pages). The default is a hybrid model's grant, 1
 * prompt page + 1 state page; -DPLAIN_KV checks a plain model's, 2 prompt
 * pages (tests/e2e/test_spin.sh runs both). PPR pages per request either way,
 * so the state space stays the size it was. */
#ifdef PLAIN_KV
#define NKV  2
#define NST  0
#else
#define NKV  1
#define NST  1
#endif
#define PPR  (NKV + NST) /* pages per request */
#define NP   3      /* decode pool pages */
#define NONE 255

/* fault budgets (override with spin -D... to explore larger configurations) */
#ifndef MAX_CONNFAIL
#define MAX_CONNFAIL 1  /* data-link losses and prefill crashes together */
#endif
#ifndef MAX_TIMEOUT
#define MAX_TIMEOUT  1  /* decode timeouts (T_grant / T_xfer) */
#endif
#ifndef MAX_TRUNC
#define MAX_TRUNC    1  /* DONEs from a faulty prefill covering too little */
#endif
#ifndef MAX_CANCEL
#define MAX_CANCEL   2  /* ABORT sends per request: 2 = one duplicate */
#endif

mtype = { ADMIT, GRANT, DENY, PREFILL, KV_PAGE, DONE, REJECT, ABORT, ABORT_ACK, TOKEN, FINISH };

/* FINISH kinds */
#define K_OK  0
#define K_ERR 1
#define K_REJ 2

/* refusal reasons a REJECT carries (admit.h: the router acts on the reason,
 * the client's status and code come from it, so it must arrive unchanged) */
#define RS_STALE   4  /* ADMIT_STALE_GRANT */
#define RS_REFUSED 1  /* ADMIT_CONTEXT_LENGTH (and the other request refusals) */

/* models (issue 40): the decode worker's pages hold model DMODEL's KV; ADMIT's
 * `a` is the request's model. (Prefill's own check of the grant's model is
 * defence in depth, not modelled: decode's check is the rule relied on.) */
#define DMODEL 0
#define MODEL_B 1

/* connections: {type, req, a, b} */
chan r2d = [6] of { mtype, byte, byte, byte };  /* router -> decode: ADMIT, ABORT */
chan d2r = [6] of { mtype, byte, byte, byte };  /* decode -> router: GRANT, DENY, TOKEN, FINISH */
chan r2p = [6] of { mtype, byte, byte, byte };  /* router -> prefill: PREFILL, ABORT */
chan p2r = [4] of { mtype, byte, byte, byte };  /* prefill -> router: REJECT */
chan p2d = [8] of { mtype, byte, byte, byte };  /* data link: KV_PAGE, DONE, REJECT, ABORT_ACK */
chan d2p = [4] of { mtype, byte, byte, byte };  /* data link back: ABORT */

/* ---- decode page pool (kv.h) ---- */
#define PG_FREE  0
#define PG_ALLOC 1
#define PG_QUAR  3
byte pstate[NP];
byte powner[NP];
byte pgen[NP];     /* allocation count (tag gen) */
bool pdirty[NP];   /* holds data (not scrubbed) */
byte pwgen[NP];    /* gen of the grant whose KV the page holds; 0 = none */

/* grants as sent (immutable once sent; each request is granted at most once) */
byte gpage[NR * PPR];
byte ggen[NR * PPR];
byte gep[NR];      /* link epoch the grant is bound to */

/* one-sided puts: the grant's remote key and the puts in flight */
#define K_NONE 0
#define K_LIVE 1
#define K_DEAD 2
byte rkey[NR];     /* created at GRANT, revoked before the pages are freed */
byte inflight[NR]; /* bit i: a put of page index i issued, not landed yet */
bool rpend[NR];    /* MUTANT_REVOKE_AFTER_FREE: revoke still to come */

byte ep = 1;       /* current data-link epoch (teardown = ep++ with drain) */
byte nconnfail, ntimeout, ntrunc;

/* ---- ghost state for the properties ---- */
bool adm_rej[NR];  /* rejected at router admission */
bool p_rej[NR];    /* rejected by prefill re-validation */
byte p_reason[NR]; /* the reason prefill's REJECT carries (RS_*) */
bool dfin[NR];     /* decode sent its FINISH */
bool granted[NR];
bool fin_ok[NR];
byte rmodel[NR];   /* the request's model (0 = DMODEL; 1: a mis-paired request of model B) */

/* router request states */
#define R_NEW       0
#define R_ADMITTING 1
#define R_PREFILL   2
#define R_FINISHED  3
#define R_REJECTED  4
#define R_ABORTED   5
byte rst[NR];
byte ncancel[NR];
#define RTERM(r) (rst[r] >= R_FINISHED)

/* decode transfer states */
#define D_NONE      0
#define D_GRANTED   1
#define D_RECEIVING 2
#define D_ABORTING  3
#define D_FREED     4
byte dst[NR];
byte rcvmask[NR];  /* pages received with a matching tag */
#define D_LIVE(r) (dst[r] == D_GRANTED || dst[r] == D_RECEIVING)
/* decode is through with r: never admitted, or denied/freed with its FINISH sent */
#define DEC_DONE(r) (adm_rej[r] || dst[r] == D_FREED && (!granted[r] || dfin[r]))

/* prefill transfer states */
#define P_IDLE     0
#define P_SENDING  1
#define P_DONESENT 2
#define P_REJECTED 3
#define P_ABORTED  4  /* tombstone */
byte pst[NR];
byte psent[NR];
byte pep[NR];      /* link epoch of the transfer */

#define NFREE ((pstate[0] == PG_FREE) + (pstate[1] == PG_FREE) + (pstate[2] == PG_FREE))
#define ALLFREE (NFREE == NP)
#define ALLCLEAN (!pdirty[0] && !pdirty[1] && !pdirty[2])

/* drains every message of a channel (connection closed and drained) */
#define DRAIN(c) do :: nempty(c) -> c?_,_,_,_ :: empty(c) -> break od

/* ------------------------------------------------------------------------ */
/* decode helpers (run inside atomic blocks of the decode process) */

/* I3: pages come only from FREE and must be clean; gen+1; tag them */
inline alloc_pages(r) {
    i = 0;
    do
    :: i < PPR ->
        pg = 0;
        do
        :: pstate[pg] == PG_FREE -> break
        :: else -> pg++
        od;
        assert(!pdirty[pg]);                 /* I3: allocation of an unclean page */
        pstate[pg] = PG_ALLOC; powner[pg] = r; pgen[pg]++;
        gpage[r * PPR + i] = pg; ggen[r * PPR + i] = pgen[pg];
        i++
    :: else -> break
    od;
    i = 0; pg = 0
}

/* revoke r's remote key and wait until the writer is fenced: a put in
 * flight has landed before, or never lands */
inline revoke_key(r) {
    rkey[r] = K_DEAD; inflight[r] = 0; rpend[r] = 0
}

/* revoke the key (one-sided writes), scrub (I3), return the pages to FREE */
inline free_pages(r) {
#ifdef MUTANT_REVOKE_AFTER_FREE
    rpend[r] = 1;                            /* BUG: the key is revoked later */
#else
    revoke_key(r);
#endif
    i = 0;
    do
    :: i < PPR ->
        pg = gpage[r * PPR + i];
        assert(powner[pg] == r && pgen[pg] == ggen[r * PPR + i]);
#ifndef MUTANT_NO_SCRUB
        pdirty[pg] = 0; pwgen[pg] = 0;
#endif
        pstate[pg] = PG_FREE; powner[pg] = NONE;
        i++
    :: else -> break
    od;
    i = 0; pg = 0
}

/* kv_seq_quarantine: pages keep owner and tag, neither read nor reused */
inline quarantine_pages(r) {
    i = 0;
    do
    :: i < PPR -> pg = gpage[r * PPR + i]; pstate[pg] = PG_QUAR; i++
    :: else -> break
    od;
    i = 0; pg = 0
}

inline send_finish(r, k) {
    assert(!dfin[r]);                        /* one FINISH per grant */
    dfin[r] = 1;
    d2r!FINISH, r, k, 0
}

/* FINISH after prefill's REJECT (F3) carries the REJECT's reason */
inline send_finish_rej(r, rsn) {
    assert(!dfin[r]);
    dfin[r] = 1;
#ifdef MUTANT_FINISH_NO_REASON
    d2r!FINISH, r, K_REJ, 0                  /* BUG: a generic error, reason lost */
#else
    d2r!FINISH, r, K_REJ, rsn
#endif
}

/* decode aborts a live transfer (router ABORT, timeout, failed check) */
inline dec_abort(r, k) {
#ifdef MUTANT_FREE_BEFORE_ACK
    free_pages(r);                           /* BUG: frees while prefill may still write */
    d2p!ABORT, r, 0, 0;
    send_finish(r, k);
    dst[r] = D_FREED
#else
    quarantine_pages(r);                     /* I5: QUARANTINE until ACK or teardown */
    d2p!ABORT, r, 0, 0;
    send_finish(r, k);
    dst[r] = D_ABORTING
#endif
}

/* ------------------------------------------------------------------------ */
proctype Decode() {
    byte r, a, b, i, pg;
end:
    do
    /* ---- control connection from the router ---- */
    :: atomic { r2d?ADMIT, r, a, b ->
        assert(!adm_rej[r]);                 /* I4: admission rejects send nothing */
        if
#ifndef MUTANT_NO_MODEL_CHECK
        :: dst[r] == D_NONE && a != DMODEL -> /* DENY MODEL: nothing reserved */
            dst[r] = D_FREED;
            d2r!DENY, r, 0, 0
        :: dst[r] == D_NONE && a == DMODEL && NFREE >= PPR ->
#else
        :: dst[r] == D_NONE && NFREE >= PPR -> /* BUG: any model's request gets pages */
#endif
            alloc_pages(r);
            rkey[r] = K_LIVE;                 /* the grant's remote key */
            gep[r] = ep; granted[r] = 1; dst[r] = D_GRANTED;
            d2r!GRANT, r, 0, 0
#ifndef MUTANT_NO_MODEL_CHECK
        :: dst[r] == D_NONE && a == DMODEL && NFREE < PPR ->
#else
        :: dst[r] == D_NONE && NFREE < PPR ->
#endif
            dst[r] = D_FREED;
            d2r!DENY, r, 0, 0
        :: else                               /* duplicate ADMIT: not modelled */
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { r2d?ABORT, r, a, b ->
        if
        :: D_LIVE(r) && gep[r] == ep -> dec_abort(r, K_ERR)
        :: else                               /* not granted, already ending, or F5 pending */
        fi;
        r = 0; a = 0; b = 0 }

    /* ---- data link from prefill ---- */
    :: atomic { p2d?KV_PAGE, r, a, b ->       /* a = page index, b = tag gen */
        if
        :: D_LIVE(r) ->
            pg = gpage[r * PPR + a];
            if
            :: b != ggen[r * PPR + a] || powner[pg] != r || pstate[pg] != PG_ALLOC ->
                dec_abort(r, K_ERR)          /* isolation violation: never commit */
            :: else ->
                rcvmask[r] = rcvmask[r] | (1 << a);
                dst[r] = D_RECEIVING
            fi
        :: else                               /* ABORTING/FREED: payload discarded */
        fi;
        r = 0; a = 0; b = 0; pg = 0 }
    :: atomic { p2d?DONE, r, a, b ->          /* a = covered units */
        if
        :: D_LIVE(r) ->
            if
#ifdef MUTANT_NO_STATE_CHECK
            :: a == NKV && (rcvmask[r] & ((1 << NKV) - 1)) == (1 << NKV) - 1 -> /* BUG */
#elif !defined(MUTANT_NO_COVERAGE)
            :: a == NKV && rcvmask[r] == (1 << PPR) - 1 ->
#else
            :: true ->                        /* BUG: no coverage check */
#endif
                /* COMMIT: check ground truth (I6, I4, M) */
                assert(!p_rej[r] && !adm_rej[r]);
                assert(rmodel[r] == DMODEL);  /* M: no page adopted across models */
                i = 0;
                do
                :: i < PPR ->
                    pg = gpage[r * PPR + i];
                    assert(powner[pg] == r && pstate[pg] == PG_ALLOC);
                    assert(pwgen[pg] == ggen[r * PPR + i] && pgen[pg] == ggen[r * PPR + i]); /* I6 */
                    i++
                :: else -> break
                od;
                i = 0; pg = 0;
                d2r!TOKEN, r, 0, 0;           /* first token travels with DONE */
                free_pages(r);                /* F1: generation over, DONE was last frame */
                send_finish(r, K_OK);
                dst[r] = D_FREED
#ifndef MUTANT_NO_COVERAGE
            :: else ->                        /* F2: verification failed */
                free_pages(r);
                send_finish(r, K_ERR);
                dst[r] = D_FREED
#endif
            fi
        :: else
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { p2d?REJECT, r, a, b ->
        if
        :: D_LIVE(r) ->                       /* F3: nothing was written */
            free_pages(r);
            send_finish_rej(r, a);
            dst[r] = D_FREED
        :: else
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { p2d?ABORT_ACK, r, a, b ->
        if
        :: dst[r] == D_ABORTING ->            /* F4: kv_pool_quarantine_free */
            free_pages(r);
            dst[r] = D_FREED
        :: else                               /* duplicate / early ACK */
        fi;
        r = 0; a = 0; b = 0 }

#ifdef MUTANT_REVOKE_AFTER_FREE
    :: atomic { rpend[0] -> revoke_key(0) }
    :: atomic { rpend[1] -> revoke_key(1) }
#endif

    /* ---- timers and teardown ---- */
    :: atomic { ntimeout < MAX_TIMEOUT && (D_LIVE(0) || D_LIVE(1)) ->
        ntimeout++;
        if
        :: D_LIVE(0) -> r = 0
        :: D_LIVE(1) -> r = 1
        fi;
#ifdef MUTANT_TIMEOUT_FREE
        free_pages(r);                        /* BUG: frees while a writer may be live */
        send_finish(r, K_ERR);
        dst[r] = D_FREED;
#else
        dec_abort(r, K_ERR);                  /* T_grant / T_xfer */
#endif
        r = 0 }
    :: atomic { (D_LIVE(0) || dst[0] == D_ABORTING) && gep[0] != ep ||
                (D_LIVE(1) || dst[1] == D_ABORTING) && gep[1] != ep ->
        /* F5: the grant's link is closed and drained */
        if
        :: (D_LIVE(0) || dst[0] == D_ABORTING) && gep[0] != ep -> r = 0
        :: (D_LIVE(1) || dst[1] == D_ABORTING) && gep[1] != ep -> r = 1
        fi;
        free_pages(r);
        if
        :: dst[r] != D_ABORTING -> send_finish(r, K_ERR)
        :: else
        fi;
        dst[r] = D_FREED;
        r = 0 }
    od
}

/* ------------------------------------------------------------------------ */
/* prefill: issues a one-sided put into decode page idx of request r's grant
 * (it lands later: Fabric) */
inline write_page(r, idx) {
    pg = gpage[r * PPR + idx];
    assert(!p_rej[r] && !adm_rej[r]);        /* I4: a rejected request gets no KV */
    assert(rmodel[r] == DMODEL);             /* M: model B's KV never lands in model A's pages */
    assert(powner[pg] == r && pgen[pg] == ggen[r * PPR + idx] && pstate[pg] != PG_FREE); /* I5 */
    inflight[r] = inflight[r] | (1 << idx);
    p2d!KV_PAGE, r, idx, ggen[r * PPR + idx];
    pg = 0
}

/* the fabric: a put lands in page idx of r's grant (only while the key is live) */
inline land_put(r, idx) {
    pg = gpage[r * PPR + idx];
    assert(!p_rej[r] && !adm_rej[r]);        /* I4 */
    assert(powner[pg] == r && pgen[pg] == ggen[r * PPR + idx] && pstate[pg] != PG_FREE); /* I5: no put in a freed or reassigned page */
    pdirty[pg] = 1; pwgen[pg] = ggen[r * PPR + idx];
    inflight[r] = inflight[r] & ~(1 << idx);
    pg = 0
}

proctype Fabric() {
    byte pg;
end:
    do
    :: atomic { rkey[0] == K_LIVE && (inflight[0] & 1) -> land_put(0, 0) }
    :: atomic { rkey[0] == K_LIVE && (inflight[0] & 2) -> land_put(0, 1) }
    :: atomic { rkey[1] == K_LIVE && (inflight[1] & 1) -> land_put(1, 0) }
    :: atomic { rkey[1] == K_LIVE && (inflight[1] & 2) -> land_put(1, 1) }
    od
}

proctype Prefill() {
    byte r, a, b, pg;
end:
    do
    :: atomic { r2p?PREFILL, r, a, b ->
        if
        :: pst[r] == P_IDLE ->
            if
#ifndef MUTANT_NO_EPOCH_CHECK
            :: gep[r] != ep ->                /* stale grant: its link is gone */
                p_rej[r] = 1; p_reason[r] = RS_STALE; pst[r] = P_REJECTED;
                p2r!REJECT, r, RS_STALE, 0
#endif
            :: true ->                        /* re-validation fails (I4) */
                p_rej[r] = 1; p_reason[r] = RS_REFUSED;
                p2r!REJECT, r, RS_REFUSED, 0;
                if
                :: gep[r] == ep -> p2d!REJECT, r, RS_REFUSED, 0
                :: else
                fi;
#ifdef MUTANT_PLACEHOLDER
                pst[r] = P_SENDING; pep[r] = gep[r]  /* BUG: goes on with a placeholder */
#else
                pst[r] = P_REJECTED
#endif
            :: true ->
#ifdef MUTANT_NO_EPOCH_CHECK
                pst[r] = P_SENDING; pep[r] = ep       /* BUG: old grant, current link */
#else
                pst[r] = P_SENDING; pep[r] = gep[r]
#endif
            fi
        :: else                               /* tombstoned or duplicate: dropped */
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { r2p?ABORT, r, a, b ->         /* router abort */
        if
        :: pst[r] == P_IDLE -> pst[r] = P_ABORTED    /* overtook PREFILL: tombstone */
        :: pst[r] != P_IDLE ->
            if
            :: pep[r] == ep && pst[r] != P_ABORTED -> p2d!ABORT_ACK, r, 0, 0
            :: else
            fi;
            pst[r] = P_ABORTED
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { d2p?ABORT, r, a, b ->         /* decode abort: always acknowledged */
#ifdef MUTANT_NO_ACK_UNKNOWN
        if
        :: pst[r] != P_IDLE -> p2d!ABORT_ACK, r, 0, 0
        :: else                               /* BUG: ABORT overtook PREFILL, no ACK */
        fi;
#else
        p2d!ABORT_ACK, r, 0, 0;               /* also for an unknown req_id */
#endif
        pst[r] = P_ABORTED;                   /* tombstone: a late PREFILL is dropped */
        r = 0; a = 0; b = 0 }

    /* sending, one page per step (an abort can come between pages) */
    :: atomic { pst[0] == P_SENDING && pep[0] == ep && psent[0] < PPR ->
        write_page(0, psent[0]); psent[0]++ }
    :: atomic { pst[1] == P_SENDING && pep[1] == ep && psent[1] < PPR ->
        write_page(1, psent[1]); psent[1]++ }
    /* DONE after a flush: every put issued has landed */
    :: atomic { pst[0] == P_SENDING && pep[0] == ep && psent[0] == PPR && inflight[0] == 0 ->
        p2d!DONE, 0, NKV, 0; pst[0] = P_DONESENT }
    :: atomic { pst[1] == P_SENDING && pep[1] == ep && psent[1] == PPR && inflight[1] == 0 ->
        p2d!DONE, 1, NKV, 0; pst[1] = P_DONESENT }
    /* a faulty prefill (version skew, its own smaller context) covers less,
     * or (hybrid) ends before the state page: DONE after the first page */
    :: atomic { ntrunc < MAX_TRUNC && pst[0] == P_SENDING && pep[0] == ep && psent[0] == 1 && inflight[0] == 0 ->
        ntrunc++; p2d!DONE, 0, psent[0], 0; pst[0] = P_DONESENT }

    /* crash and restart: every connection lost and drained, state forgotten */
    :: atomic { nconnfail < MAX_CONNFAIL ->
        nconnfail++; ep++;
        DRAIN(p2d); DRAIN(d2p); DRAIN(r2p); DRAIN(p2r);
        pst[0] = P_IDLE; pst[1] = P_IDLE; psent[0] = 0; psent[1] = 0; pep[0] = 0; pep[1] = 0 }
    od
}

/* the data link breaks (loss, PROTO error, or decode's T_ack teardown) */
proctype Link() {
end:
    do
    :: atomic { nconnfail < MAX_CONNFAIL ->
        nconnfail++; ep++;
        DRAIN(p2d); DRAIN(d2p);
        /* prefill sees the close: transfers on the dead link are dropped
         * (they could not write anyway: every write checks its link epoch) */
        if :: pst[0] == P_SENDING -> pst[0] = P_ABORTED :: else fi;
        if :: pst[1] == P_SENDING -> pst[1] = P_ABORTED :: else fi }
    od
}

/* ------------------------------------------------------------------------ */
inline set_term(r, s) {
    if
    :: !RTERM(r) -> rst[r] = s
    :: else                                   /* keep the first terminal state */
    fi
}

/* prefill refused r (its REJECT, or decode's FINISH after it, whichever
 * comes first): the reason the router acts on is the one prefill chose */
inline refused(r, rsn) {
    if
    :: !RTERM(r) ->
        assert(rsn == p_reason[r]);           /* the refusal reason crosses unchanged */
        rst[r] = R_REJECTED
    :: else
    fi
}

proctype Router() {
    byte r, a, b;
    do
    /* admission (I4): reject before anything is allocated or sent */
    :: atomic { rst[0] == R_NEW ->
        if
        :: adm_rej[0] = 1; rst[0] = R_REJECTED
#ifdef MUTANT_ADMIT_REJECTED
           ; r2d!ADMIT, 0, 0, 0               /* BUG: the queue only checks "finished" */
#endif
        :: rst[0] = R_ADMITTING; r2d!ADMIT, 0, 0, 0
        fi }
    :: atomic { rst[1] == R_NEW && rst[0] != R_NEW ->
        if
        :: adm_rej[1] = 1; rst[1] = R_REJECTED
#ifdef MUTANT_ADMIT_REJECTED
           ; r2d!ADMIT, 1, 0, 0               /* BUG: the queue only checks "finished" */
#endif
        :: rst[1] = R_ADMITTING; r2d!ADMIT, 1, 0, 0
        :: rst[1] = R_ADMITTING; rmodel[1] = MODEL_B;  /* a faulty router: model B's */
           r2d!ADMIT, 1, MODEL_B, 0                    /* request to model A's decode */
        fi }
    :: atomic { d2r?GRANT, r, a, b ->
        if
        :: rst[r] == R_ADMITTING -> rst[r] = R_PREFILL; r2p!PREFILL, r, 0, 0
        :: else                               /* cancelled meanwhile: decode got the ABORT */
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { d2r?DENY, r, a, b -> set_term(r, R_REJECTED); r = 0; a = 0; b = 0 }
    :: atomic { d2r?TOKEN, r, a, b ->
        assert(rst[r] != R_REJECTED && !p_rej[r] && !adm_rej[r]);  /* I4: no tokens */
        r = 0; a = 0; b = 0 }
    :: atomic { d2r?FINISH, r, a, b ->
        if
        :: a == K_OK ->
            assert(rst[r] != R_REJECTED);     /* a rejected request never finishes OK */
            fin_ok[r] = 1;
            set_term(r, R_FINISHED)
        :: a == K_REJ -> refused(r, b)
        :: a == K_ERR -> set_term(r, R_ABORTED)
        fi;
        r = 0; a = 0; b = 0 }
    :: atomic { p2r?REJECT, r, a, b ->
        assert(!fin_ok[r]);                   /* REJECT and FINISH OK are exclusive */
        refused(r, a);
        r = 0; a = 0; b = 0 }
    /* the client goes away: ABORT to both workers; a second one is a duplicate */
    :: atomic { (rst[0] == R_ADMITTING || rst[0] == R_PREFILL ||
                 rst[0] == R_ABORTED && ncancel[0] == 1) && ncancel[0] < MAX_CANCEL ->
        r = 0;
        ncancel[r]++;
        r2d!ABORT, r, 0, 0;
        if
        :: rst[r] == R_PREFILL || rst[r] == R_ABORTED -> r2p!ABORT, r, 0, 0
        :: else
        fi;
        set_term(r, R_ABORTED);
        r = 0 }
    :: atomic { (rst[1] == R_ADMITTING || rst[1] == R_PREFILL ||
                 rst[1] == R_ABORTED && ncancel[1] == 1) && ncancel[1] < MAX_CANCEL ->
        r = 1;
        ncancel[r]++;
        r2d!ABORT, r, 0, 0;
        if
        :: rst[r] == R_PREFILL || rst[r] == R_ABORTED -> r2p!ABORT, r, 0, 0
        :: else
        fi;
        set_term(r, R_ABORTED);
        r = 0 }
    /* done once both requests are terminal at the router and decode has
     * finished with both (FINISH sent for every grant, every page FREE):
     * pages stuck in QUARANTINE block here (invalid end state) */
    :: atomic { RTERM(0) && RTERM(1) && DEC_DONE(0) && DEC_DONE(1) && ALLFREE ->
        assert(ALLCLEAN);                     /* I3: every freed page scrubbed */
        break }
    od
}

init {
    byte k;
    atomic {
        k = 0;
        do
        :: k < NP -> powner[k] = NONE; k++
        :: else -> break
        od;
        k = 0;
        run Decode(); run Prefill(); run Link(); run Router(); run Fabric()
    }
}
