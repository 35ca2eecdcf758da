/* handshake.pml — Promela model of how kvseal's cluster connections are
 * authenticated and how a data link comes up (docs/pd-protocol.md sections
 * 3 and 10), against an intruder who controls the network.
 *
 * Kept apart from pd.pml (the transfer protocol): the handshake decides which
 * authenticated peer a link belongs to, and the transfer model starts from
 * there; together in one model the state space would multiply for nothing.
 *
 * Parties (honest, all holding the cluster secret):
 *   P1  prefill worker 1; its control connection to the router was taken by
 *       the intruder (who squats the router's port). P1 also has a live data
 *       link to D from before (live[1]).
 *   P2  prefill worker 2, opening its data link to D (the only honest
 *       session that intends to reach D's data port). It may send LINK with
 *       a stale worker id (1: e.g. an id from before a router restart).
 *   D   a decode worker's data port: two responder sessions, one after the
 *       other (so replays of an earlier session can be tried on a later one).
 * Intruder I (no secret): every honest message goes to I; I delivers any
 * message it has seen to any honest party, any number of times (bounded),
 * in any order (relay, replay, reorder), and builds any message that needs
 * no key: HELLO with any role and any nonce it knows, and, where frames are
 * not protected (the v1 handshake), LINK with any worker id. MACs, TLS
 * binders, Finished messages and records are symbolic: a message carries the
 * inputs of its MAC, and I can only replay such a message, never build one.
 *
 * The default model is the TLS 1.3 PSK handshake (src/pd/tls.c): the
 * client's ClientHello names the PSK of its connection kind (client role C,
 * server role S) and proves it (binder); the server answers under the same
 * PSK with its nonce (ServerHello..Finished); the client's Finished covers
 * both nonces; every later frame is sealed under the session (both nonces).
 *
 * Properties (assertions):
 *   AGREE  D opens a session only with an honest prefill session that
 *          intended to connect to D's data port, with the same nonces
 *   LINK   D accepts LINK only on an agreed session and only with the
 *          worker id of the prefill at the other end
 *   LIVE   a live link is never replaced (only the router's RETIRE, not
 *          modelled here, or the link's own close end it)
 *
 * Mutants (tests/e2e/test_spin.sh; spin must report a violation):
 *   MUTANT_V1_HANDSHAKE   the KVPD v1 HELLO/AUTH handshake with plaintext
 *                         frames after it: I splices P1's control connection
 *                         into D's data port (AGREE fails)
 *   MUTANT_NO_KIND_BINDING one PSK for every connection kind (the server does
 *                         not check that the kind is its own): the same relay
 *                         through TLS (AGREE fails)
 *   MUTANT_LINK_REPLACE   D lets a LINK replace a live link of that worker
 *                         id (LIVE fails)
 */

mtype = { HELLO, AUTH, CH, SH, CF, LINK };

#define R_ROUTER  1
#define R_PREFILL 2
#define R_DECODE  3

/* nonces */
#define NP1 1   /* P1's control connection */
#define NP2 2   /* P2's data link */
#define ND0 3   /* D, session 0 */
#define ND1 4   /* D, session 1 */
#define NI  5   /* the intruder's own */

#ifndef MAX_INJ
#ifdef MUTANT_V1_HANDSHAKE
#define MAX_INJ 3   /* the v1 splice needs 3 actions: a larger budget only slows the search */
#else
#define MAX_INJ 5   /* messages the intruder delivers or builds (6: 14M states) */
#endif
#endif
#define NK 10       /* messages the intruder can remember */

/* {type, a, b, c, d}:
 *   HELLO {role, nonce, 0, 0}                         v1, no key
 *   AUTH  {dir, sender role, sender nonce, receiver nonce}   v1, MAC
 *   CH    {C, S, client nonce, 0}                     TLS ClientHello + binder
 *   SH    {C, S, client nonce, server nonce}          TLS server flight + Finished
 *   CF    {C, S, client nonce, server nonce}          TLS client Finished
 *   LINK  {worker id, client nonce, server nonce, sealed}  sealed = 1: a TLS
 *         record of that session; 0: a v1 plaintext frame */
chan net  = [3] of { mtype, byte, byte, byte, byte };  /* honest -> intruder */
chan to_p1 = [2] of { mtype, byte, byte, byte, byte };
chan to_p2 = [2] of { mtype, byte, byte, byte, byte };
chan to_d  = [2] of { mtype, byte, byte, byte, byte };

bool live[3];        /* live[id]: D has a live link from prefill worker id */
byte d_links;        /* links D brought up */

// ---------------------------------------------------------------------------
// Intruder

mtype kt[NK];
byte ka[NK], kb[NK], kc[NK], kd[NK];
byte nk;
byte known = (1 << NI);  /* nonces the intruder has seen (bit n) */
byte ninj;

inline learn(t, a, b, c, d) {
    atomic {
        i = 0;
        do
        :: i < nk && kt[i] == t && ka[i] == a && kb[i] == b && kc[i] == c && kd[i] == d -> break
        :: i < nk && !(kt[i] == t && ka[i] == a && kb[i] == b && kc[i] == c && kd[i] == d) -> i++
        :: i >= nk -> break
        od;
        if
        :: i == nk && nk < NK -> kt[nk] = t; ka[nk] = a; kb[nk] = b; kc[nk] = c; kd[nk] = d; nk++
        :: else -> skip
        fi;
        /* nonces inside a message become known (MACs stay opaque) */
        if
        :: t == HELLO -> known = known | (1 << b)
        :: t == AUTH || t == SH || t == CF -> known = known | (1 << c) | (1 << d)
        :: t == CH -> known = known | (1 << c)
        :: else -> skip
        fi
    }
}

/* deliver {t,a,b,c,d} to one honest party with room */
inline deliver(t, a, b, c, d) {
    if
    :: nfull(to_p1) -> to_p1 ! t, a, b, c, d
    :: nfull(to_p2) -> to_p2 ! t, a, b, c, d
    :: nfull(to_d) -> to_d ! t, a, b, c, d
    fi
}

active proctype I() {
    mtype t;
    byte a, b, c, d, i, n;
end:
    do
    :: net ? t, a, b, c, d -> learn(t, a, b, c, d)
    :: ninj < MAX_INJ && nk > 0 ->  /* relay / replay a message seen, in any order */
        atomic {
            i = 0;
            do
            :: i < nk - 1 -> i++
            :: break
            od;
            ninj++;
            t = kt[i]; a = ka[i]; b = kb[i]; c = kc[i]; d = kd[i]
        };
        deliver(t, a, b, c, d)
#ifdef MUTANT_V1_HANDSHAKE
    :: ninj < MAX_INJ ->  /* HELLO needs no key: any role, any known nonce */
        atomic {
            ninj++;
            if
            :: a = R_ROUTER
            :: a = R_PREFILL
            :: a = R_DECODE
            fi;
            if
            :: (known & (1 << NP1)) -> n = NP1
            :: (known & (1 << NP2)) -> n = NP2
            :: (known & (1 << ND0)) -> n = ND0
            :: (known & (1 << ND1)) -> n = ND1
            :: n = NI
            fi
        };
        deliver(HELLO, a, n, 0, 0)
    :: ninj < MAX_INJ && nfull(to_d) ->  /* v1 frames are plaintext: LINK for any id */
        atomic {
            ninj++;
            if
            :: a = 1
            :: a = 2
            fi
        };
        to_d ! LINK, a, 0, 0, 0
#endif
    od
}

// ---------------------------------------------------------------------------
// P1: prefill worker 1, connecting to "the router" (the intruder's port)

active proctype P1() {
    mtype t;
    byte a, b, c, d;
#ifdef MUTANT_V1_HANDSHAKE
    net ! HELLO, R_PREFILL, NP1, 0, 0;
end1:
    to_p1 ? t, a, b, c, d;
    if
    :: t == HELLO && a == R_ROUTER && b != NP1 -> skip  /* accepts a router only */
    :: else -> goto done
    fi;
    /* its MAC: {1, PREFILL, NP1, the "router" nonce} (what the router
     * would answer, {2, ROUTER, n, NP1}, I cannot make: P1 never opens) */
    net ! AUTH, 1, R_PREFILL, NP1, b;
#else
    net ! CH, R_PREFILL, R_ROUTER, NP1, 0;
end1:
    to_p1 ? t, a, b, c, d;
    if
    :: t == SH && a == R_PREFILL && b == R_ROUTER && c == NP1 -> net ! CF, a, b, c, d
    :: else -> skip
    fi;
#endif
done:
end3:
    skip
}

// ---------------------------------------------------------------------------
// P2: prefill worker 2, opening its data link to D

active proctype P2() {
    mtype t;
    byte a, b, c, d, ns, id;
#ifdef MUTANT_V1_HANDSHAKE
    net ! HELLO, R_PREFILL, NP2, 0, 0;
end1:
    to_p2 ? t, a, b, c, d;
    if
    :: t == HELLO && a == R_DECODE && b != NP2 -> ns = b
    :: else -> goto done
    fi;
    net ! AUTH, 1, R_PREFILL, NP2, ns;
end2:
    to_p2 ? t, a, b, c, d;
    if
    :: t == AUTH && a == 2 && b == R_DECODE && c == ns && d == NP2 -> skip
    :: else -> goto done
    fi;
#else
    net ! CH, R_PREFILL, R_DECODE, NP2, 0;
end1:
    to_p2 ? t, a, b, c, d;
    if
    :: t == SH && a == R_PREFILL && b == R_DECODE && c == NP2 -> ns = d; net ! CF, a, b, c, d
    :: else -> goto done
    fi;
#endif
    /* its own id, or a stale one (a worker id from before a router restart) */
    if
    :: id = 2
    :: id = 1
    fi;
#ifdef MUTANT_V1_HANDSHAKE
    net ! LINK, id, 0, 0, 0;
#else
    net ! LINK, id, NP2, ns, 1;
#endif
done:
end3:
    skip
}

// ---------------------------------------------------------------------------
// D: a decode worker's data port (accepts prefill workers only)

active proctype D() {
    mtype t;
    byte a, b, c, d, k, nd, pn, sk;
    live[1] = true;  /* P1's data link from before */
    k = 0;
    do
    :: k < 2 ->
        nd = ND0 + k;
        k++;
#ifdef MUTANT_V1_HANDSHAKE
        net ! HELLO, R_DECODE, nd, 0, 0;
end1:
        to_d ? t, a, b, c, d;
        if
        :: t == HELLO && a == R_PREFILL && b != nd -> pn = b
        :: else -> goto next
        fi;
        net ! AUTH, 2, R_DECODE, nd, pn;
end2:
        to_d ? t, a, b, c, d;
        if
        :: t == AUTH && a == 1 && b == R_PREFILL && c == pn && d == nd -> skip
        :: else -> goto next
        fi;
#else
end3:
        to_d ? t, a, b, c, d;
        if
#ifdef MUTANT_NO_KIND_BINDING
        :: t == CH && a == R_PREFILL -> pn = c; sk = b  /* any kind: one PSK for all */
#else
        :: t == CH && a == R_PREFILL && b == R_DECODE -> pn = c; sk = b
#endif
        :: else -> goto next
        fi;
        net ! SH, a, b, pn, nd;
end4:
        to_d ? t, a, b, c, d;
        if
        :: t == CF && a == R_PREFILL && b == sk && c == pn && d == nd -> skip
        :: else -> goto next
        fi;
#endif
        /* AGREE: the peer is the honest session that meant to reach us */
        assert(pn == NP2);
end5:
        to_d ? t, a, b, c, d;
        if
#ifdef MUTANT_V1_HANDSHAKE
        :: t == LINK -> skip                       /* plaintext: anyone's */
#else
        :: t == LINK && d == 1 && b == pn && c == nd -> skip  /* sealed in this session */
#endif
        :: else -> goto next
        fi;
        if
#ifndef MUTANT_LINK_REPLACE
        :: live[a] -> goto next  /* refused: a live link is never replaced */
#endif
        :: else ->
            assert(!live[a]);  /* LIVE */
            assert(pn == NP2 && a == 2);  /* LINK: P2's own id on P2's session */
            live[a] = true;
            d_links++
        fi;
next:
        skip
    :: k >= 2 -> break
    od
}
