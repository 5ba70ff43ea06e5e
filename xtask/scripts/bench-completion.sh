#!/bin/sh
# vfpoll perf's completion modes in one boot: poll, irq and hybrid, 4 KiB randread at QD 1 and
# QD 32 on NVMe B namespace 1, one worker pinned to CPU 1, 3 rounds of 5 s (the order of the
# modes reversed in round 2); perf's JSON per run in /out (the run dir's out/). Then an idle
# interrupt-mode daemon (examples/irq_daemon.rs): one read, then its process CPU time over 10 s
# of idling (/out/idle.txt). Run from the repository root, release builds first:
#   cargo build --release -p vfpoll --bin vfpoll --example irq_daemon
#   cargo xtask vm --no-build --hugepages 64 --run-dir /tmp/irqrun -- xtask/scripts/bench-completion.sh
V=${V:-target/release/vfpoll}
D=${D:-target/release/examples/irq_daemon}
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
M2=""
if [ -n "$M" ]; then M2=--noiommu; fi
if [ -x "$D" ]; then
  # "cpu" prints the process CPU seconds so far: one after the read, one 10 s later.
  { echo 0; sleep 1; echo cpu; sleep 10; echo cpu; } | taskset -c 1 $D $B $M2 > /out/idle.txt 2>/out/idle.err
  awk '/^cpu/ {c[n++] = $2} END {if (n == 2) printf "idle irq daemon: %.4f s of CPU in 10 s = %.3f %% of a core\n", c[1] - c[0], (c[1] - c[0]) * 10; else print "idle irq daemon: no result (see /out/idle.err)"}' /out/idle.txt
else
  echo "idle irq daemon: $D missing (cargo build --release -p vfpoll --example irq_daemon)"
fi
$V reset $B >/dev/null
