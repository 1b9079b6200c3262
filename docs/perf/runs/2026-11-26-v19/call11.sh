#!/usr/bin/env bash
# Session 6 call 11: the review pass (union placement extracted, capture helper): the union,
# kept-schedule, graph and uploaded-mask tests; D=64 once.
set -u
cd "$(dirname "$0")/.." || exit 1
export FLEXJIT_CACHE_DIR=$(mktemp -d)
T=.carry/build/flexjit-tests
timeout -k 5 300 $T "forward: sm90a_wgmma's 192-row tiles over block masks match the reference,forward: a block mask keeps its union schedule for later calls until its arrays change,forward: 192-row tiles over a block mask in a captured CUDA graph,forward: uploaded block masks give the dense-mask result" 2>&1 | grep -E "passed|failed|FAILED|test cases" | tail -3
timeout -k 5 60 .carry/build/flexjit bench --only-extra --case d64 --csv /tmp/d64.csv > /dev/null 2>&1; grep -v '^impl' /tmp/d64.csv | cut -d, -f2,12 | tr '\n' ' '
