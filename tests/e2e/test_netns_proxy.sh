#!/usr/bin/env bash
# A userspace proxy between prefill and decode on real network stacks:
# 25 ms latency, then every connection cut in the middle of a KV page, under
# three tenants' canary load (netns_proxy_run.sh, phases 1 and 2).
NS_PHASES="1 2" exec bash "$(dirname "$0")/netns_proxy_run.sh"
