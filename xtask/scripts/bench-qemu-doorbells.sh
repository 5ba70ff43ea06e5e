#!/bin/sh
# Do the driver's doorbell choices hold on both emulators? (BENCHMARKS.md, "QEMU 7.2 and 10").
# NVMe A, 4 KiB randread at QD1 and QD32, one worker on CPU 1, 5 s runs (BENCH_SECS): the
# driver's defaults (shadow doorbells, deferred CQ head doorbell), --no-shadow-doorbell (every
# doorbell an MMIO write) and --no-cq-defer (CQ head doorbell at every poll that reaped),
# alternating, 3 rounds; perf's JSON per run in /out (the run dir's out/), then one line per case:
# medians over the rounds of IOPS, p50 and p99 (each on its own), the IOPS range, and the
# doorbell writes per I/O of the median-IOPS run (MMIO SQ tail, MMIO CQ head, shadow-only
# updates). The binary: the first argument (an absolute path: the host's / is shared read-only
# into the guest, which does not inherit the host's environment), or target/release/vfpoll. Run
# from the repository root, release build first, one boot per emulator:
#   cargo build --release -p vfpoll
#   cargo xtask vm --qemu 7.2 --no-build --hugepages 64 --run-dir /tmp/dbq7 -- xtask/scripts/bench-qemu-doorbells.sh
#   cargo xtask vm --qemu 10 --no-build --hugepages 64 --run-dir /tmp/dbq10 -- xtask/scripts/bench-qemu-doorbells.sh
# The table again, on the host, from a run dir: sh xtask/scripts/bench-qemu-doorbells.sh --summary /tmp/dbq7/out
if [ "${1:-}" = --summary ]; then
  OUT=$2
else
  OUT=/out
  V=${1:-target/release/vfpoll}
  A=0000:00:03.0
  M=""
  if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
  T=${BENCH_SECS:-5}
  $V bind $A >/dev/null || exit 1
  mkdir -p $OUT
  $V --version > $OUT/version.txt 2>&1
  for r in 1 2 3; do
    for qd in 1 32; do
      for case in default no-shadow-doorbell no-cq-defer; do
        flag=""
        [ $case = default ] || flag=--$case
        taskset -c 1 $V perf -d $A $M -w randread -q $qd -t $T --cores 1 --size 64m $flag --json \
          > $OUT/$case-qd$qd-r$r.json 2>$OUT/$case-qd$qd-r$r.err
        echo "$case qd$qd r$r: exit $?"
      done
    done
  done
  $V reset $A >/dev/null
fi
python3 - "$OUT" <<'EOF'
import json, statistics, sys
d = sys.argv[1]
print(f"{'case':<20}{'QD':>4}{'IOPS':>8}{'IOPS range':>15}{'p50 us':>9}{'p99 us':>9}"
      f"{'SQ MMIO/IO':>12}{'CQ MMIO/IO':>12}{'shadow/IO':>11}")
for qd in (1, 32):
    for case in ("default", "no-shadow-doorbell", "no-cq-defer"):
        runs = []
        for r in (1, 2, 3):
            try:
                runs.append(json.load(open(f"{d}/{case}-qd{qd}-r{r}.json")))
            except Exception as e:
                print(f"{case} qd{qd} r{r}: {e}")
        if not runs:
            continue
        iops = [x["iops"] for x in runs]
        med = lambda f: statistics.median(f(x) for x in runs)
        mid = sorted(runs, key=lambda x: x["iops"])[len(runs) // 2]
        q = [q for w in mid["workers"] for q in w["queues"]]
        ios = sum(x["ios"] for x in q) or 1
        per = lambda k: sum(x[k] for x in q) / ios
        print(f"{case:<20}{qd:>4}{statistics.median(iops):>8.0f}{min(iops):>8.0f}-{max(iops):<6.0f}"
              f"{med(lambda x: x['lat_ns']['p50']) / 1e3:>9.1f}{med(lambda x: x['lat_ns']['p99']) / 1e3:>9.1f}"
              f"{per('sq_doorbells'):>12.3f}{per('cq_doorbells'):>12.3f}{per('shadow_only'):>11.3f}")
EOF
