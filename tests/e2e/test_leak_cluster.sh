#!/usr/bin/env bash
# The leak suite in disaggregated mode: router + 2 prefill + 2 decode workers
# (6 tenants with canaries, over-long requests, mid-stream disconnects, pools
# small enough that requests wait); every answer must equal `kvseal serve`'s
# and every page of every worker must end FREE and scrubbed. Runs under the
# sanitizers too (the fault and broken-build runs are in test_cluster_faults.sh).
LEAK_DISAGG=1 LEAK_THREADS=1 bash "$(dirname "$0")/leak_run.sh"
