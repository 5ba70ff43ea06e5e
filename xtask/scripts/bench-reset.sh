#!/bin/sh
# Controller reset figures (BENCHMARKS.md, "Controller reset"): NVMe A, 4 KiB randread at QD32,
# one worker on CPU 1, 10 s runs with and without `perf --reset-every 1`, 3 rounds, then a
# verify pass under `--reset-every 0.5`; perf's JSON per run in /out (the run dir's out/). The
# binary: the first argument (an absolute path: the host's / is shared read-only into the
# guest, which does not inherit the host's environment), or target/release/vfpoll. Run from
# the repository root, release build first:
#   cargo build --release -p vfpoll
#   cargo xtask vm [--noiommu] --no-build --hugepages 64 --run-dir /tmp/resetrun -- xtask/scripts/bench-reset.sh [BIN]
V=${1:-target/release/vfpoll}
A=0000:00:03.0
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
$V bind $A >/dev/null || exit 1
mkdir -p /out
$V --version > /out/version.txt 2>&1
for r in 1 2 3; do
  taskset -c 1 $V perf -d $A $M -w randread -q 32 -t 10 --cores 1 --size 64m --json \
    > /out/base-r$r.json 2>/out/base-r$r.err
  echo "base r$r: exit $?"
  taskset -c 1 $V perf -d $A $M -w randread -q 32 -t 10 --cores 1 --size 64m --reset-every 1 \
    --json > /out/reset-r$r.json 2>/out/reset-r$r.err
  echo "reset r$r: exit $?"
done
taskset -c 1 $V perf -d $A $M --verify -w randwrite -q 32 --cores 1 --size 64m --reset-every 0.5 \
  --json > /out/verify.json 2>/out/verify.err
echo "verify: exit $?"
$V reset $A >/dev/null
