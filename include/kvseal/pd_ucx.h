/* pd_ucx.h — the UCX data plane's transport: one-sided puts of sealed KV pages
 * (pd_seal.h) into memory the decode worker registers per grant.
 * docs/pd-protocol.md section 11.
 *
 * Decode maps a grant's staging area (pd_ucx_map: the remote key is created at
 * GRANT and travels with it) and revokes it (pd_ucx_revoke) before the area can
 * be reused; prefill opens the packed key (pd_ucx_rkey_open), puts sealed pages
 * (pd_ucx_put) and flushes (pd_ucx_flush_*) before it sends DONE on the TLS
 * link. Worker addresses travel over the authenticated TLS link; nothing UCX
 * carries is trusted before its seal verifies.
 *
 * Threading: a pd_ucx and everything made from it belong to one thread, which
 * must call pd_ucx_progress while anything is pending (a peer's puts over UCX's
 * tcp emulation land only while the receiving worker progresses). */
#ifndef KS_PD_UCX_H
#define KS_PD_UCX_H

#include "kvseal/base.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pd_ucx pd_ucx;               /* a UCP context + worker */
typedef struct pd_ucx_ep pd_ucx_ep;         /* an endpoint to a peer's worker */
typedef struct pd_ucx_region pd_ucx_region; /* decode: a mapped area and its key */
typedef struct pd_ucx_rkey pd_ucx_rkey;     /* prefill: a peer's unpacked key */

/* Creates a context with RMA and a worker. tls: UCX transports to use (e.g.
 * "tcp", "sm", "rc,sm"; as UCX_TLS), NULL for UCX's choice (environment).
 * KS_ERR_UNSUPPORTED when UCX cannot start with them. */
ks_err pd_ucx_create(const char *tls, pd_ucx **out, ks_errbuf *eb);
/* Destroys the worker and context; every ep, region and rkey must be gone. */
void pd_ucx_destroy(pd_ucx *u);
/* The worker's address (valid until destroy), to send to the peer. */
const void *pd_ucx_address(const pd_ucx *u, size_t *len);
/* Progresses the worker once; returns how many events it handled. */
unsigned pd_ucx_progress(pd_ucx *u);
/* Creates an endpoint to the worker at addr (connection set-up completes in
 * the background, on progress). */
ks_err pd_ucx_connect(pd_ucx *u, const void *addr, size_t len, pd_ucx_ep **out,
                      ks_errbuf *eb);
/* Closes an endpoint (forcefully: puts not flushed may be lost); progresses
 * until UCX has released it. */
void pd_ucx_ep_close(pd_ucx_ep *ep);

/* Registers [base, base+len) for remote writes and packs its remote key (the
 * grant's key). */
ks_err pd_ucx_map(pd_ucx *u, void *base, size_t len, pd_ucx_region **out, ks_errbuf *eb);
/* The packed remote key and the area's address, to send with the GRANT. */
const void *pd_ucx_region_key(const pd_ucx_region *r, size_t *len, uint64_t *remote_addr);
/* Revokes the key: unmaps the area (transports with real registration, RDMA,
 * refuse later writes with it) and frees r. */
void pd_ucx_revoke(pd_ucx_region *r);

/* Unpacks a peer's key for puts on ep. */
ks_err pd_ucx_rkey_open(pd_ucx_ep *ep, const void *packed, size_t len, pd_ucx_rkey **out,
                        ks_errbuf *eb);
/* Destroys an unpacked key. */
void pd_ucx_rkey_close(pd_ucx_rkey *k);
/* Starts a put of len bytes at src into remote_addr (inside k's area). src
 * must stay unchanged until the next flush completes. */
ks_err pd_ucx_put(pd_ucx_ep *ep, pd_ucx_rkey *k, const void *src, size_t len,
                  uint64_t remote_addr, ks_errbuf *eb);
/* Starts a flush of every put issued on ep (KS_ERR_INVAL if one is running). */
ks_err pd_ucx_flush_start(pd_ucx_ep *ep, ks_errbuf *eb);
/* KS_OK once the flush has completed (every put before it landed remotely),
 * KS_ERR_AGAIN while it runs (progress and call again), KS_ERR_IO if it or a
 * put failed. */
ks_err pd_ucx_flush_poll(pd_ucx_ep *ep, ks_errbuf *eb);

#endif
