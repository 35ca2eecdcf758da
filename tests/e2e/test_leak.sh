#!/usr/bin/env bash
# The leak suite against the normal build: must pass.
bash "$(dirname "$0")/leak_run.sh"
