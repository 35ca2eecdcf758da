/* pd_seal.h — per-page AES-256-GCM sealing of KV pages for data planes that
 * carry no encryption of their own (the UCX plane: RDMA fabrics, UCX's tcp and
 * shared-memory transports). docs/pd-protocol.md section 11.
 *
 * Keys: both ends of an authenticated TLS data link export the same 32-byte
 * link key (TLS exporter, label PD_SEAL_LABEL, context = the link epoch); each
 * grant gets its own key, HMAC-SHA256(link key, "kvseal-grant" || req_id ||
 * seq_uid), so a key seals the pages of exactly one grant (seq_uid is new for
 * every grant on a decode worker). Nonce: the record number in the grant (a
 * page, or a layer group of a deep model's page; 96 bits, big-endian); a
 * sealer refuses a record number not above the last one it sealed, so no
 * nonce is ever reused under a key. AAD binds the page's place: req_id, the
 * page's tag (seq_uid, gen), the decode page id, the page index, n_rows and
 * the layer range. A page is readable only after its tag verifies
 * (pd_seal_open writes plaintext into the destination and scrubs it on
 * failure); the tag is also the integrity check that replaces the frame
 * checksum on this plane. */
#ifndef KS_PD_SEAL_H
#define KS_PD_SEAL_H

#include "kvseal/pd.h"

#include <sys/uio.h>

#define PD_SEAL_LABEL "EXPORTER-kvseal-kv-seal"
#define PD_SEAL_KEY_BYTES 32u
#define PD_SEAL_TAG_BYTES 16u /* a sealed page is its plaintext's size + this */

/* Where a page belongs; every field is authenticated (AAD). */
typedef struct pd_seal_ad {
    uint64_t req_id;
    uint64_t seq_uid;     /* the page's tag: the grant's sequence uid ... */
    uint64_t gen;         /* ... and the page's allocation generation */
    uint32_t record;      /* record number in the grant: the nonce */
    uint32_t page_id;     /* decode pool page id */
    uint32_t page_index;  /* index in the grant */
    uint32_t n_rows;      /* KV rows the page holds */
    uint32_t layer_lo;    /* layer range [lo, hi) */
    uint32_t layer_hi;
} pd_seal_ad;

/* One grant's sealing state (one direction: a sealer or an opener). */
typedef struct pd_seal_grant {
    struct evp_cipher_ctx_st *ctx;
    uint64_t req_id, seq_uid;
    bool sealer;
    bool sealed_any;       /* sealer: a record was sealed */
    uint32_t last_record;  /* sealer: the last record number sealed */
} pd_seal_grant;

/* The link key of an OPEN TLS conn (loop thread only): both ends of one
 * connection get the same key, other connections or epochs other keys.
 * KS_ERR_UNSUPPORTED on a plaintext (--insecure-plaintext) conn. */
ks_err pd_seal_link_key(pd_conn *c, uint64_t link_epoch, uint8_t key[PD_SEAL_KEY_BYTES],
                        ks_errbuf *eb);
/* Starts a grant's sealer (prefill) or opener (decode) under the link key;
 * (req_id, seq_uid) must be the grant's. KS_ERR_NOMEM/INTERNAL. */
ks_err pd_seal_grant_init(pd_seal_grant *g, const uint8_t link_key[PD_SEAL_KEY_BYTES],
                          uint64_t req_id, uint64_t seq_uid, bool sealer, ks_errbuf *eb);
/* Frees g's cipher context and wipes its key; g may be zeroed or freed twice. */
void pd_seal_grant_free(pd_seal_grant *g);
/* Seals the n bytes of iov[0..n_iov) into out (n + PD_SEAL_TAG_BYTES; out
 * may be the plaintext itself when n_iov is 1). ad's req_id/seq_uid must be
 * the grant's (KS_ERR_INVAL), its record above the last one sealed
 * (KS_ERR_INVAL: a nonce is never reused). */
ks_err pd_seal_pagev(pd_seal_grant *g, const pd_seal_ad *ad, const struct iovec *iov, int n_iov,
                     void *out, ks_errbuf *eb);
/* pd_seal_pagev of one buffer plain[0..n). */
ks_err pd_seal_page(pd_seal_grant *g, const pd_seal_ad *ad, const void *plain, size_t n,
                    void *out, ks_errbuf *eb);
/* Opens a sealed page (n plaintext bytes + tag) into out (n bytes, may be
 * sealed itself). KS_ERR_PROTO when the tag does not verify (tampered bytes,
 * another grant's or place's page): out is then zeroed, never readable. */
ks_err pd_seal_open(pd_seal_grant *g, const pd_seal_ad *ad, const void *sealed, size_t n,
                    void *out, ks_errbuf *eb);
/* pd_seal_open into the pieces dst[0..n_dst) (lengths summing to n; a page's
 * planes), all zeroed when the tag does not verify. */
ks_err pd_seal_openv(pd_seal_grant *g, const pd_seal_ad *ad, const void *sealed, size_t n,
                     const struct iovec *dst, int n_dst, ks_errbuf *eb);

#endif
