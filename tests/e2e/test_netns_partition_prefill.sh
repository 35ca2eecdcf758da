#!/usr/bin/env bash
# A decode worker cut off from prefill but not from the router, under three
# tenants' canary load, on real network stacks (netns_partition_run.sh, B).
NS_PHASES=B exec bash "$(dirname "$0")/netns_partition_run.sh"
