#!/bin/sh
# Runs the binaries built by build_run.sh (on a GPU machine): correctness cases, then benches.
d=${1:-out/fj}
fails=0
r() { "$@" || fails=$((fails + 1)); }
for bin in noop_bf16_128 causal_bf16_128 noop_bf16_128_w8 causal_bf16_128_w8 alibi_f16_64 softcap_bf16_256 causal_f16_64_s3; do
  r $d/$bin 2 4 4 300 333 0 1 100
  r $d/$bin 1 2 2 1000 1000 1 0 100
  r $d/$bin 2 2 2 17 1 0 0 100
  r $d/$bin 1 2 2 513 2047 1 1 100
done
for bin in noop_bf16_128_div causal_bf16_128_w8_div; do
  r $d/$bin 2 4 4 512 1024 0 1 0
  r $d/$bin 2 4 4 1024 1024 1 0 0
done
r $d/softcap_bf16_256 1 2 2 200 300 1 0 -1
r $d/softcap_bf16_256 1 2 2 200 300 0 0 -1
r $d/gqa_bf16_128_64 2 8 2 333 444 0 0 0
r $d/gqa_bf16_128_64 2 8 2 1024 1024 1 1 0
r $d/qk64_v128_f16 2 4 2 333 444 0 1 0
echo "correctness failures: $fails"
if [ -n "$BENCH" ]; then
  for bin in noop_bf16_128_div noop_bf16_128 noop_bf16_128_w8; do $d/$bin 4 16 16 4096 4096 0 0 0 20; done
  for bin in causal_bf16_128 causal_bf16_128_w8 causal_bf16_128_w8_div; do $d/$bin 4 16 16 4096 4096 1 0 0 20; done
fi
