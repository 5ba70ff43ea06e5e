#!/bin/bash
# Device removal under load, timed (BENCHMARKS.md, "Device removal"): vfpoll perf (release
# build) runs 4 KiB random reads at QD 32 on NVMe R (behind a PCIe root port) and NVMe B; 3 s
# in, R is unplugged with QMP device_del through the harness's agent (/out/qmp, see
# xtask/src/qmp.rs), which times device_del -> DEVICE_DELETED on the host. perf prints how long
# after the kernel's request the driver released the device. R is plugged back (device_add) and
# the round repeats, 5 rounds. Run from the repository root, release build first:
#   cargo build --release -p vfpoll
#   cargo xtask vm --hotplug --no-build --hugepages 64 --run-dir /tmp/rmrun -- xtask/scripts/bench-removal.sh
# Results: /out/removal.txt (one line per round), perf's output in /out/removal-rN.{out,err}.
V=${VFPOLL_REMOVAL_BIN:-target/release/vfpoll}
R=0000:01:00.0
B=0000:00:04.0
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
mkdir -p /out/qmp
: > /out/removal.txt

# qmp NAME JSON [WAIT-LINE]: one request to the agent; prints its answer.
qmp() {
  printf '%s\n%s\n' "$2" "${3:-}" > "/out/qmp/$1.tmp" && mv "/out/qmp/$1.tmp" "/out/qmp/$1.req"
  for _ in $(seq 6000); do
    [ -f "/out/qmp/$1.resp" ] && { cat "/out/qmp/$1.resp"; return 0; }
    sleep 0.01
  done
  echo "no answer to $1" >&2
  return 1
}

$V bind $R >/dev/null && $V bind $B >/dev/null || exit 1
# QEMU's ACPI hotplug trace (in QEMU's stderr) and the guest kernel's log, for a round that fails.
qmp trace '{"execute":"trace-event-set-state","arguments":{"name":"acpi_pci_*","enable":true}}' >/dev/null
for r in $(seq "${VFPOLL_ROUNDS:-5}"); do
  $V perf -d $R -d $B $M --workload randread --queue-depth 32 --time 20 \
    > /out/removal-r$r.out 2> /out/removal-r$r.err &
  pid=$!
  sleep 3
  ans=$(qmp del$r '{"execute":"device_del","arguments":{"id":"nvmer"}}' 'wait DEVICE_DELETED 30000')
  ms=$(echo "$ans" | sed -n 's/^event_ms //p')
  wait $pid
  rc=$?
  rel=$(sed -n 's/.*released \([0-9.]*\) ms after the kernel.*/\1/p' /out/removal-r$r.err)
  echo "round $r: device_del -> DEVICE_DELETED ${ms:-none} ms (host); request -> release ${rel:-none} ms (driver); perf exit $rc" | tee -a /out/removal.txt
  if [ -z "$ms" ]; then
    dmesg | tail -60 > /out/dmesg-r$r.txt
    { echo "$ans"
      qmp qom$r '{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}'
      qmp late$r '{"execute":"query-status"}' 'wait DEVICE_DELETED 60000'
    } > /out/qmp-r$r.txt
    echo "round $r: no DEVICE_DELETED; QEMU's view in /out/qmp-r$r.txt" | tee -a /out/removal.txt
    exit 1
  fi
  qmp add$r '{"execute":"device_add","arguments":{"driver":"nvme","id":"nvmer","bus":"rp1","serial":"vfpoll-r","drive":"nvmer1"}}' >/dev/null
  for _ in $(seq 3000); do [ -e /sys/bus/pci/devices/$R ] && break; sleep 0.01; done
  for _ in $(seq 300); do [ -e /sys/bus/pci/devices/$R/driver ] && break; sleep 0.01; done
  $V bind $R >/dev/null || exit 1
done
$V reset $B >/dev/null
