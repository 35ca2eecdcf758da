#!/usr/bin/env bash
# A decode worker cut off from the router but not from prefill, under three
# tenants' canary load, on real network stacks (netns_partition_run.sh, A).
NS_PHASES=A exec bash "$(dirname "$0")/netns_partition_run.sh"
