#!/bin/sh
# Hybrid completion against polling at queue depth 1 in one boot: vfpoll perf 4 KiB randread on
# NVMe B namespace 1, one worker pinned to CPU 1, 3 s per run, two rounds of: poll, hybrid with
# a 10 ms spin (never sleeps), 1 ms, and the default 50 us. Run from the repository root:
#   cargo build --release -p vfpoll
#   cargo xtask vm --no-build --hugepages 64 --run-dir /tmp/hyb -- xtask/scripts/bench-hybrid.sh
V=${V:-target/release/vfpoll}
B=0000:00:04.0
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
$V bind $B >/dev/null || exit 1
for r in 1 2; do
  for a in "--completion poll" "--completion hybrid --hybrid-spin-us 10000" \
           "--completion hybrid --hybrid-spin-us 1000" "--completion hybrid"; do
    echo "$a: $(taskset -c 1 $V perf --device $B $M --workload randread --queue-depth 1 --time 3 \
      --cores 1 $a 2>&1 | grep -i 'read: IOPS\|mean' | tr '\n' ' ' | cut -c1-150)"
  done
done
$V reset $B >/dev/null
