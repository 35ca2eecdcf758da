#!/usr/bin/env bash
# test_hybrid_serve.sh with nemotron_h (Mamba2, attention and MLP layers):
# its recurrent state (each Mamba2 layer's convolution window and heads'
# head_dim x state rows) in state pages, counted at deploy time, handed
# over between prefill and decode, FREE and scrubbed afterwards. Three
# Mamba2 layers: 28 state pages, within the test's pool of 100 (four made
# 37, past it). Seed 11 (qwen35's) generates a U+0001 token, which the
# streamed-text comparison's JSON escaping tells apart: seed 12 does not.
# Chat through serve and the cluster with Nemotron Nano v2's template.
HYBRID_TEMPLATE="${KS_SHARED:-$(dirname "$0")/../../../shared}/templates/NVIDIA-Nemotron-Nano-v2.jinja" \
    HYBRID_MK_ARGS="--arch nemotron_h --pattern M-M*-M*- --seed 12" \
    exec bash "$(dirname "$0")/test_hybrid_serve.sh"
