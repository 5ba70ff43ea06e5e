#!/bin/bash
# vfpoll store against the kernel's paths, in one boot, on the test bed's big namespaces (NVMe
# controllers G and H, --big-ns): per round, in alternating order,
#  - kernel: fio io_uring sequential write and read (1 MiB, QD32 per device, O_DIRECT) on the
#    raw block devices of G and H, then the checkpoint (SIZE in ENTRIES arrays) written with
#    numpy's np.save (a plain write() where numpy is missing) to ext4 on each, fsync'ed per
#    file, read back with np.load after dropping the page cache;
#  - vfpoll: G and H on vfio-pci, `vfpoll perf` sequential write and read of the same bytes
#    (1 MiB, QD32 per device, one worker driving both), then `vfpoll store bench --repeat 1`
#    (its own raw sequential rate through the store's device layer, checkpoint save/load with
#    crc on and off, KV 64 KiB gets and puts).
# Prints one JSON line per run and medians at the end. Run from the repository root, release
# build first:
#   cargo build --release -p vfpoll
#   cargo xtask vm --no-build --big-ns 1G --mem 4G --hugepages 256 --timeout 900 -- xtask/scripts/bench-store.sh
# Environment: ROUNDS (3), SIZE (512M), ENTRIES (8), V (the vfpoll binary, target/release/vfpoll).
set -euo pipefail
V=${V:-target/release/vfpoll}
G=0000:00:0e.0
H=0000:00:0f.0
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-512M}
ENTRIES=${ENTRIES:-8}
M=""
if [ "${VFPOLL_TESTBED:-}" = noiommu ]; then M=--noiommu; fi
# numpy from the Python package's venv where it was built (cargo xtask test), else none.
PY=python3
if [ -x target/python/venv/bin/python ] && target/python/venv/bin/python -c 'import numpy' 2>/dev/null; then
  PY=target/python/venv/bin/python
fi
# ext4 is a module in the guest kernel (the host has no kmod: busybox modprobe).
# ext4 checksums its metadata with the kernel's crc32c, also a module here.
for m in ext4 crc32c_generic crc32c-intel; do busybox modprobe $m 2>/dev/null || true; done
OUT=/tmp/bench-store
mkdir -p $OUT
RESULTS=$OUT/results.jsonl
: > $RESULTS
bytes=$(python3 -c "
s='$SIZE'.upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))")

# The kernel's block device of a controller's namespace 1 (waits for it after a rebind).
blk_of() {
  for _ in $(seq 1 100); do
    for d in /sys/bus/pci/devices/$1/nvme/nvme*/nvme*n1; do
      if [ -e "$d" ]; then echo /dev/$(basename $d); return 0; fi
    done
    sleep 0.1
  done
  echo "no block device for $1" >&2; return 1
}

kernel_round() {
  local r=$1 g h
  g=$(blk_of $G); h=$(blk_of $H)
  local half=$((bytes / 2))
  for rw in write read; do
    fio --output-format=json --group_reporting --ioengine=io_uring --direct=1 --rw=$rw --bs=1M \
        --iodepth=32 --offset=1M --size=$half --end_fsync=1 \
        --name=g --filename=$g --name=h --filename=$h > $OUT/fio.json
    python3 - "$r" "$rw" $OUT/fio.json >> $RESULTS <<'EOF'
import json, sys
j = json.load(open(sys.argv[3]))["jobs"][0]
side = j[sys.argv[2]]
print(json.dumps({"round": int(sys.argv[1]), "what": "fio io_uring raw seq " + sys.argv[2],
                  "gb_s": side["bw_bytes"] / 1e9,
                  "cpu_s_per_gb": (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1000 / (side["io_bytes"] / 1e9)}))
EOF
  done
  for d in $g $h; do mkfs.ext4 -q -F -E nodiscard $d; done
  mkdir -p $OUT/g $OUT/h
  mount $g $OUT/g
  mount $h $OUT/h
  $PY - "$r" "$bytes" "$ENTRIES" $OUT/g $OUT/h >> $RESULTS <<'EOF'
import json, os, sys, time
r, size, entries, dirs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
n = size // entries
try:
    import numpy as np
    arrays = [np.frombuffer(os.urandom(n), dtype=np.uint8) for _ in range(entries)]
    how = "np.save"
except ImportError:
    np = None
    arrays = [os.urandom(n) for _ in range(entries)]
    how = "write()"
paths = [os.path.join(dirs[i % len(dirs)], f"layer{i}.npy") for i in range(entries)]
c0, t0 = time.process_time(), time.perf_counter()
for a, p in zip(arrays, paths):
    with open(p, "wb") as f:
        if np is not None:
            np.save(f, a)
        else:
            f.write(a)
        f.flush()
        os.fsync(f.fileno())
save, csave = time.perf_counter() - t0, time.process_time() - c0
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3\n")
c0, t0 = time.process_time(), time.perf_counter()
back = [np.load(p) if np is not None else open(p, "rb").read() for p in paths]
load, cload = time.perf_counter() - t0, time.process_time() - c0
assert all((bytes(b) == bytes(a)) for a, b in zip(arrays, back)), "read back differs"
gb = n * entries / 1e9
print(json.dumps({"round": r, "what": f"ext4 {how} save (fsync)", "gb_s": gb / save, "cpu_s_per_gb": csave / gb}))
print(json.dumps({"round": r, "what": f"ext4 {'np.load' if np else 'read()'} load (cold cache)", "gb_s": gb / load, "cpu_s_per_gb": cload / gb}))
EOF
  umount $OUT/g $OUT/h
}

vfpoll_round() {
  local r=$1
  $V bind $G $H >/dev/null
  # The driver's own sequential rate on the same namespaces, as many bytes as the checkpoint
  # (the store bench formats the namespaces afterwards).
  for rw in write read; do
    $V perf -d $G -d $H $M -w $rw -o 1m -q 32 --ios $((bytes >> 20)) --json > $OUT/perf.json
    python3 - "$r" "$rw" $OUT/perf.json >> $RESULTS <<'EOF'
import json, sys
j = json.load(open(sys.argv[3]))
gb = j["job"]["ios"] * j["job"]["io_size"] / 1e9
print(json.dumps({"round": int(sys.argv[1]), "what": "vfpoll perf seq " + sys.argv[2],
                  "gb_s": j["bw_bytes"] / 1e9, "cpu_s_per_gb": j["cpu"]["process_s"] / gb}))
EOF
  done
  $V store bench vfio:$G/1 vfio:$H/1 $M --yes --size $SIZE --entries $ENTRIES --repeat 1 --seed $r --json > $OUT/vfpoll.json
  python3 - "$r" $OUT/vfpoll.json >> $RESULTS <<'EOF'
import json, sys
r, j = int(sys.argv[1]), json.load(open(sys.argv[2]))
for k, name in [("raw_seq_write", "vfpoll raw seq write (+flush)"), ("raw_seq_read", "vfpoll raw seq read"),
                ("checkpoint_save", "vfpoll store checkpoint save (durable)"),
                ("checkpoint_load_crc", "vfpoll store checkpoint load, crc on"),
                ("checkpoint_load_nocrc", "vfpoll store checkpoint load, crc off"),
                ("raw_read_qd32", "vfpoll raw 64K read QD32"), ("kv_get_batch32", "vfpoll store KV get batch 32"),
                ("kv_put_batch32", "vfpoll store KV put batch 32")]:
    print(json.dumps({"round": r, "what": name, "gb_s": j[k]["gb_s"], "cpu_s_per_gb": j[k]["cpu_s_per_gb"]}))
for k, name in [("raw_read_qd1", "vfpoll raw 64K read QD1"), ("kv_get_qd1_hit", "vfpoll store KV get QD1 hit"),
                ("kv_get_qd1_miss", "vfpoll store KV get QD1 miss")]:
    print(json.dumps({"round": r, "what": name, "p50_us": j[k]["p50_us"], "p99_us": j[k]["p99_us"]}))
EOF
  $V reset $G $H >/dev/null
}

echo "bench-store: $ROUNDS rounds, $SIZE in $ENTRIES entries over $G and $H; python: $PY; $V"
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then kernel_round $r; vfpoll_round $r; else vfpoll_round $r; kernel_round $r; fi
  grep "\"round\": $r," $RESULTS
done
python3 - $RESULTS <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["what"] for r in rows))
print("\nmedians over rounds (min-max):")
med = {}
for n in names:
    rs = [r for r in rows if r["what"] == n]
    if "gb_s" in rs[0]:
        g = [r["gb_s"] for r in rs]; c = [r["cpu_s_per_gb"] for r in rs]
        med[n] = statistics.median(g)
        print(f"{n:<44} {statistics.median(g):7.3f} GB/s ({min(g):.3f}-{max(g):.3f})  CPU {statistics.median(c):6.3f} s/GB")
    else:
        p = [r["p50_us"] for r in rs]; q = [r["p99_us"] for r in rs]
        med[n] = statistics.median(p)
        print(f"{n:<44} p50 {statistics.median(p):8.1f} us ({min(p):.1f}-{max(p):.1f})  p99 {statistics.median(q):8.1f} us")
def ratio(a, b):
    ka = next((k for k in med if k.startswith(a)), None); kb = next((k for k in med if k.startswith(b)), None)
    return f"{med[ka] / med[kb]:.2f}x" if ka and kb and med[kb] else "-"
print("\nratios of medians:")
print("store save / vfpoll perf seq write:      ", ratio("vfpoll store checkpoint save", "vfpoll perf seq write"))
print("store load (crc on) / vfpoll perf seq read:", ratio("vfpoll store checkpoint load, crc on", "vfpoll perf seq read"))
print("store load (crc off) / vfpoll perf seq read:", ratio("vfpoll store checkpoint load, crc off", "vfpoll perf seq read"))
print("store save / vfpoll raw seq write:       ", ratio("vfpoll store checkpoint save", "vfpoll raw seq write"))
print("store load (crc on) / vfpoll raw seq read:", ratio("vfpoll store checkpoint load, crc on", "vfpoll raw seq read"))
print("store save / ext4 save:                  ", ratio("vfpoll store checkpoint save", "ext4"))
print("store load / ext4 load:                  ", ratio("vfpoll store checkpoint load, crc on", "ext4 np.load"), ratio("vfpoll store checkpoint load, crc on", "ext4 read()"))
print("store save / fio io_uring raw write:     ", ratio("vfpoll store checkpoint save", "fio io_uring raw seq write"))
print("store load / fio io_uring raw read:      ", ratio("vfpoll store checkpoint load, crc on", "fio io_uring raw seq read"))
print("KV hit QD1 p50 / raw 64K QD1 p50:        ", ratio("vfpoll store KV get QD1 hit", "vfpoll raw 64K read QD1"))
print("KV batch32 / raw 64K QD32:               ", ratio("vfpoll store KV get batch 32", "vfpoll raw 64K read QD32"))
EOF
