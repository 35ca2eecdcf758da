#!/usr/bin/env bash
# A proxy between prefill and decode that swallows everything mid-transfer
# (connections open and acknowledged, nothing delivered), under three
# tenants' canary load (netns_proxy_run.sh, phase 3).
NS_PHASES=3 exec bash "$(dirname "$0")/netns_proxy_run.sh"
