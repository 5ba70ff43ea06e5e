#!/bin/bash
# CPU that an idle `vfpoll target` takes (its process, all threads) and the guest's context
# switches per second, with no host and with one host connected (keep-alives only), for two
# builds alternating twice: OLD and NEW (paths of vfpoll binaries; default target/release/vfpoll
# for both). Serves NVMe B namespace 1, process pinned to CPU 0. Run from the repository root:
#   cargo xtask vm --no-build --hugepages 64 --run-dir /tmp/idle -- \
#     xtask/scripts/bench-target-idle.sh /path/to/old/vfpoll target/release/vfpoll
set -u
OLD=${1:-target/release/vfpoll}
NEW=${2:-target/release/vfpoll}
B=0000:00:04.0
NQN=nqn.2026-11.io.vfpoll:idle
HOST="--hostnqn nqn.2014-08.org.nvmexpress:uuid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b --hostid 5f1c1a52-7a8e-4c8b-9d0e-76667061726b"
for m in crc32c_generic nvme-tcp; do
  [ -d /sys/module/$(echo $m | tr - _) ] || busybox modprobe $m || exit 1
done
busybox ip link set lo up
HZ=$(getconf CLK_TCK)
cpu() { cut -d' ' -f14,15 /proc/$1/stat | awk '{print $1+$2}'; }
ctx() { awk '/^ctxt/ {print $2}' /proc/stat; }
measure() { # LABEL PID
  a=$(cpu $2); c0=$(ctx); sleep 5; b=$(cpu $2); c1=$(ctx)
  echo "$1: $(( (b-a) * 1000 / (5*HZ) ))/1000 core, guest context switches/s $(( (c1-c0)/5 ))"
}
one() { # LABEL BINARY
  $2 bind $B >/dev/null || exit 1
  taskset -c 0 $2 target --ns $B/1 --listen 127.0.0.1:4420 --nqn $NQN > /tmp/idle-target.log 2>&1 &
  T=$!
  for _ in $(seq 300); do grep -q '^vfpoll target:' /tmp/idle-target.log && break; sleep 0.2; done
  sleep 2; measure "$1 idle, no host" $T
  nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN $HOST >/dev/null || exit 1
  sleep 2; measure "$1 idle, one host connected" $T
  nvme disconnect -n $NQN >/dev/null
  kill -INT $T; wait $T; $2 reset $B >/dev/null
}
for r in 1 2; do
  one "old ($OLD)" $OLD
  one "new ($NEW)" $NEW
done
