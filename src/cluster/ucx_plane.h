/* ucx_plane.h — the UCX data plane of the cluster workers (--data-plane ucx;
 * docs/pd-protocol.md section 11): KV pages travel as sealed records
 * (pd_seal.h) that prefill writes with one-sided puts (pd_ucx.h) into a
 * per-grant staging area of the decode worker; the TLS data link still
 * carries LINK/LINK_ACK (with decode's UCX address), DONE, REJECT, ABORT and
 * ABORT_ACK. Pool pages are never registered with UCX: decode opens each
 * record (the tag verifies, or nothing of it becomes readable) into the
 * granted pages through pd_recv, exactly as a KV_PAGE frame would arrive.
 *
 * Staging record, at an 8-aligned offset: u32 data_len (0 ends the area),
 * u32 record number (the nonce: 0, 1, ...), the KV_PAGE page header (40
 * bytes, authenticated), data_len bytes of sealed page data, 16-byte tag.
 *
 * Threading: one cl_ucx per worker, used from the worker's loop thread only. */
#ifndef KS_CLUSTER_UCX_PLANE_H
#define KS_CLUSTER_UCX_PLANE_H

#include "cluster_int.h"

#include "kvseal/pd_recv.h"

typedef struct cl_ucx cl_ucx;

/* Starts UCX (transports from the UCX_TLS environment variable, UCX's
 * default otherwise) for pages of geometry g. KS_ERR_UNSUPPORTED when UCX
 * cannot start. */
ks_err cl_ucx_create(const kv_geom *g, cl_ucx **out, ks_errbuf *eb) KS_MUST_USE;
/* Revokes and frees everything; accepts NULL. */
void cl_ucx_destroy(cl_ucx *u);
/* Progresses the UCX worker (puts land on decode, complete on prefill), a
 * bounded number of rounds; returns the events handled. */
unsigned cl_ucx_progress(cl_ucx *u);
/* True while a grant's staging area is mapped (decode: poll without sleeping). */
bool cl_ucx_busy(const cl_ucx *u);

// ---- decode

/* This worker's UCX address, for LINK_ACK. */
const void *cl_ucxd_address(const cl_ucx *u, size_t *len);
/* A data link came up: exports its sealing key (TLS exporter). */
ks_err cl_ucxd_link_up(cl_ucx *u, pd_conn *c, uint64_t epoch, ks_errbuf *eb) KS_MUST_USE;
/* The link is closed: every grant on it is revoked. */
void cl_ucxd_link_closed(cl_ucx *u, uint64_t epoch);
/* A grant on link epoch: maps a staging area, creates its key and returns the
 * GRANT payload with the UCX fields (*out valid until the next call). */
ks_err cl_ucxd_grant(cl_ucx *u, uint64_t req_id, uint64_t epoch, const uint8_t *grant,
                     uint32_t grant_len, const uint8_t **out, uint32_t *out_len,
                     ks_errbuf *eb) KS_MUST_USE;
/* DONE arrived for req_id (prefill flushed every put before it): opens every
 * record into the granted pages through rcv (a record that does not verify
 * ends the request as a failed KV_PAGE would), then revokes the grant's key.
 * Returns the sealed bytes delivered. */
uint64_t cl_ucxd_deliver(cl_ucx *u, uint64_t req_id, pd_recv *rcv);
/* The grant ended without DONE (abort, reject, F2-F5): its key is revoked. */
void cl_ucxd_end(cl_ucx *u, uint64_t req_id);

// ---- prefill

/* The link to decode_id came up (LINK_ACK with decode's UCX address):
 * connects to it and exports the link's sealing key. */
ks_err cl_ucxp_link_up(cl_ucx *u, pd_conn *c, uint32_t decode_id, uint64_t epoch,
                       const uint8_t *addr, uint32_t addr_len, ks_errbuf *eb) KS_MUST_USE;
/* The link closed: its transfers are dropped and its endpoint closed. */
void cl_ucxp_link_closed(cl_ucx *u, uint32_t decode_id, uint64_t epoch);
/* A PREFILL (payload as received): when its grant carries a UCX key, records
 * the transfer so its KV_PAGE frames go as puts. Never fails the request:
 * without a transfer its pages go on the TLS link. */
void cl_ucxp_prefill(cl_ucx *u, uint64_t req_id, const uint8_t *payload, uint32_t len);
/* Forgets req_id's transfer (pd_send holds no transfer for it). */
void cl_ucxp_forget(cl_ucx *u, uint64_t req_id);

typedef enum cl_ucx_verdict {
    CL_UCX_SEND = 0,     /* send the frame on the TLS link as usual */
    CL_UCX_CONSUMED = 1, /* the frame went as a put: send nothing */
    CL_UCX_FAILED = 2,   /* the transfer cannot continue: close the link (F5) */
} cl_ucx_verdict;

/* pd_send's frame for req_id on link (decode_id, epoch): a KV_PAGE of a UCX
 * transfer is sealed and put (CONSUMED); before DONE, ABORT, ABORT_ACK or
 * REJECT every put is flushed (landed) and the transfer is forgotten. */
cl_ucx_verdict cl_ucxp_frame(cl_ucx *u, uint32_t decode_id, uint64_t epoch, uint16_t type,
                             uint64_t req_id, const struct iovec *iov, int n_iov);

#endif
