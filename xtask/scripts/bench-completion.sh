#!/bin/sh
# vfpoll perf's completion modes in one boot: poll, irq and hybrid, 4 KiB randread at QD 1 and
# QD 32 on NVMe B namespace 1, one worker pinned to CPU 1, 3 rounds of 5 s (the order of the
# modes reversed in round 2); perf's JSON per run in /out (the run dir's out/). Run from the
# repository root, release build first:
#   cargo build --release -p vfpoll
#   cargo xtask vm --no-build --hugepages 64 --run-dir /tmp/irqrun -- xtask/scripts/bench-completion.sh
V=${V:-target/release/vfpoll}
B=0000:00:04.0
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
$V bind $B >/dev/null || exit 1
mkdir -p /out
for r in 1 2 3; do
  case $r in 2) modes="hybrid irq poll";; *) modes="poll irq hybrid";; esac
  for qd in 1 32; do
    for m in $modes; do
      taskset -c 1 $V perf --device $B $M --workload randread --queue-depth $qd --time 5 \
        --cores 1 --completion $m --json > /out/$m-qd$qd-r$r.json 2>/out/$m-qd$qd-r$r.err
      echo "$m qd$qd r$r: exit $?"
    done
  done
done
$V reset $B >/dev/null
