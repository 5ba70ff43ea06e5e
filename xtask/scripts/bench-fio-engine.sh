#!/bin/bash
# fio with vfpoll's engine against vfpoll perf in one boot, NVMe A namespace 1, 4 KiB randread,
# CPU 1, 5 s runs, three rounds: two engine builds (OLD, NEW: paths of libvfpoll_fio.so) at
# fio's defaults, NEW with batched reaping, then QD1. Run from the repository root with a
# release vfpoll (V, default target/release/vfpoll):
#   cargo xtask vm --no-build --hugepages 64 --run-dir /tmp/fioeng -- \
#     xtask/scripts/bench-fio-engine.sh OLD.so NEW.so
set -u
V=${V:-target/release/vfpoll}
OLD=$1
NEW=$2
A=0000:00:03.0
$V bind $A >/dev/null || exit 1
f() { # LABEL ENGINE QD EXTRA
  fio --name=x --thread --ioengine=external:$2 --filename=0000.00.03.0/1 --rw=randread --bs=4k --iodepth=$3 --size=64M --time_based --runtime=5 --cpus_allowed=1 --output-format=terse --eta=never $4 > /out/f.txt 2>/out/f.err
  echo "$1 qd$3: $(cut -d';' -f8 /out/f.txt) IOPS"
}
p() { # QD
  $V perf --device $A --workload randread --queue-depth $1 --time 5 --cores 1 --json > /out/p$1.json 2>/dev/null
  echo "perf qd$1: $(python3 -c "import json,sys; d=json.load(open(\"/out/p$1.json\")); print(d.get(\"iops\") or d.get(\"total\",{}).get(\"iops\"))" 2>/dev/null)"
}
for r in 1 2 3; do
  p 32; f old $OLD 32 ""; f new $NEW 32 ""
  f new-batched $NEW 32 "--iodepth_batch_submit=16 --iodepth_batch_complete_min=8 --iodepth_batch_complete_max=32"
done
p 1; f old $OLD 1 ""; f new $NEW 1 ""
