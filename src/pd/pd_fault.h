/* pd_fault.h — TEST ONLY: fault injection on outgoing pd frames, for the
 * protocol's failure tests (tests/unit/test_pd.c, the e2e cluster fault
 * suites). Not part of the public API (include/kvseal/pd.h): built only with
 * -DKS_TEST_FAULTS=ON (or any KS_BROKEN variant). Defined in tcp.c.
 *
 * Spec (env KS_PD_FAULT, read at pd_loop_create, or pd_fault_set): a comma-
 * separated list of ACTION:TYPE:N[:ARG], acting on the N-th outgoing frame of
 * TYPE sent in this process (1-based; N = 0: every such frame):
 *   drop:T:N          the frame is not sent at all
 *   dup:T:N           the frame is sent twice
 *   delay:T:N:MS      the frame (and everything after it on that conn, to keep
 *                     TCP order) leaves MS milliseconds later
 *   trunc:T:N         header + half the payload are sent, then the conn closes
 *   corrupt:T:N       one payload byte is flipped after the checksum is computed
 *   stall:T:N:MS      header + half the payload are sent, the rest MS later (the
 *                     peer holds a half-received frame meanwhile)
 * Example: KS_PD_FAULT="drop:7:2,delay:5:0:200". */
#ifndef KS_PD_FAULT_H
#define KS_PD_FAULT_H

#include "kvseal/base.h"

#ifdef KS_TEST_FAULTS
/* Replaces the active fault list (NULL or "" clears it); counters restart.
 * Errors: KS_ERR_INVAL on a malformed spec. Not thread-safe: call it while no
 * loop is sending. */
ks_err pd_fault_set(const char *spec, ks_errbuf *eb) KS_MUST_USE;
#endif

#endif /* KS_PD_FAULT_H */
