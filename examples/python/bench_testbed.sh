#!/bin/sh
# numpy through vfpoll (Python) on VFIO NVMe against np.save on ext4, in one test-bed boot:
#
#   cargo xtask vm --big-ns 1G --hugepages 160 -- sh examples/python/bench_testbed.sh [--mib 256]
#
# Controller G (0000:00:0e.0) goes to vfio-pci and holds the store; controller H (0000:00:0f.0)
# stays on the kernel's nvme driver and gets an ext4 file system. Needs the environment of
# `cargo xtask test`'s python step (target/python/venv, the wheel installed).
set -eu
PY=${PY:-target/python/venv/bin/python}
G=0000:00:0e.0
H=0000:00:0f.0
vfpoll bind "$G" >/dev/null
# H's namespace: the block device whose sysfs path runs through H.
dev=
for b in /sys/block/nvme*; do
    if readlink -f "$b" | grep -q "$H"; then dev=/dev/$(basename "$b"); fi
done
[ -b "$dev" ] || { echo "no block device for $H" >&2; exit 1; }
# ext4 and the crc32c it checksums metadata with are modules in the guest kernel.
for m in ext4 crc32c_generic crc32c-intel; do busybox modprobe $m 2>/dev/null || true; done
mkfs.ext4 -q -F -E nodiscard "$dev"
mkdir -p /tmp/ext4
mount "$dev" /tmp/ext4
"$PY" examples/python/bench_numpy.py --store "vfio:$G/1" --dir /tmp/ext4 "$@"
umount /tmp/ext4
