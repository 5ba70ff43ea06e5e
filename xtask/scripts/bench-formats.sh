#!/bin/bash
# 4 KiB randread at QD 1 and QD 32 on the test bed's controller F, in one boot: 512 B blocks
# without metadata (namespace 7) against 512 + 8 extended (1), 512 + 8 in a separate buffer (2)
# and 512 + 8 holding PI type 1 (3, PRACT), alternating, five rounds of 4 s; prints IOPS and
# p99 (µs) per run. Run from the repository root, release build first:
#   cargo build --release -p vfpoll
#   cargo xtask vm --no-build --hugepages 64 --timeout 880 -- xtask/scripts/bench-formats.sh
set -euo pipefail
V=target/release/vfpoll
$V bind 0000:00:0b.0 >/dev/null
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
for round in 1 2 3 4 5; do
  for qd in 1 32; do
    for ns in 7 1 2 3; do
      r=$($V perf --device 0000:00:0b.0 $M --nsid $ns --workload randread --io-size 4k \
            --queue-depth $qd --time 4 --size 4m --json |
          python3 -c 'import json,sys; j=json.load(sys.stdin); print(round(j["read"]["iops"]), round(j["read"]["lat_ns"]["p99"]/1000))')
      echo "round=$round qd=$qd ns=$ns iops_p99us=$r"
    done
  done
done
