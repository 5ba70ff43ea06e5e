#!/usr/bin/env bash
# Runs a command as a fresh Debian 12 machine would, without touching this machine's own state.
#
#   xtask/scripts/fresh-machine.sh cargo xtask demo
#   xtask/scripts/fresh-machine.sh sh -c 'cargo xtask setup && cargo xtask demo && cargo xtask test'
#
# A developer's machine keeps what earlier setups added (deb-src and backports lines, the
# test-bed packages, target/testbed), so setup code that works here may still fail on a new
# machine. This script runs the command in a private mount namespace (unshare -m) where:
#   - /etc/apt/sources.list.d holds only what a fresh Debian 12 image has (debian.sources: the
#     release, -updates and -security, binary packages only) and /etc/apt/sources.list is empty;
#   - apt's lists are a scratch copy holding only those suites' binary indexes (no Sources, no
#     backports), as on a fresh image;
#   - dpkg's database is a scratch copy from which the test bed's own packages are removed
#     (qemu-system-x86 busybox-static fio nvme-cli), so setup installs them again (apt unpacks
#     the same files over this machine's own copies: nothing on the host changes version);
#   - target/testbed and target/fio-src are empty scratch directories.
# Everything scratch lives under target/fresh-machine/ (wiped at each start, so each run starts
# fresh); the mounts vanish when the command exits. Needs root (for unshare -m) and a Debian 12
# host. What setup writes into /etc/apt/sources.list.d goes into the scratch copy, and what it
# installs is recorded in the scratch dpkg database only.
set -euo pipefail
[ $# -gt 0 ] || { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ "$(id -u)" = 0 ] || { echo "fresh-machine.sh: needs root (unshare -m)" >&2; exit 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
scratch="$root/target/fresh-machine"
# Unmount leftovers of an interrupted run (mounts are private, but be safe), then start empty.
rm -rf "$scratch"
mkdir -p "$scratch"/{sources.list.d,lists/partial,dpkg,testbed,fio-src} "$root/target/testbed" "$root/target/fio-src"

cat >"$scratch/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
: >"$scratch/sources.list"

# The lists of exactly those suites' binary packages, where this machine has them (apt fetches
# what is missing at its first `apt-get update`, as a fresh machine's setup does anyway).
for f in /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_* \
    /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm-updates_* \
    /var/lib/apt/lists/deb.debian.org_debian-security_dists_bookworm-security_*; do
    [ -e "$f" ] || continue
    case "$f" in *_source_Sources*) continue ;; esac
    cp -p "$f" "$scratch/lists/"
done

# dpkg's database without the test bed's packages.
cp -a /var/lib/dpkg/. "$scratch/dpkg/"
python3 - "$scratch/dpkg/status" qemu-system-x86 busybox-static fio nvme-cli <<'PY'
import sys
path, drop = sys.argv[1], set(sys.argv[2:])
stanzas = open(path, encoding="utf-8").read().split("\n\n")
keep = [s for s in stanzas if not any(l == f"Package: {p}" for p in drop for l in s.splitlines())]
open(path, "w", encoding="utf-8").write("\n\n".join(keep))
PY

exec unshare -m --propagation private -- sh -c '
set -e
s=$1; r=$2; shift 2
mount --bind "$s/sources.list.d" /etc/apt/sources.list.d
[ -e /etc/apt/sources.list ] && mount --bind "$s/sources.list" /etc/apt/sources.list
mount --bind "$s/lists" /var/lib/apt/lists
mount --bind "$s/dpkg" /var/lib/dpkg
mount --bind "$s/testbed" "$r/target/testbed"
mount --bind "$s/fio-src" "$r/target/fio-src"
echo "fresh-machine: apt sources: $(ls /etc/apt/sources.list.d | tr "\n" " ")" >&2
echo "fresh-machine: hidden packages: qemu-system-x86 busybox-static fio nvme-cli; scratch target/testbed, target/fio-src" >&2
cd "$r"
exec "$@"
' fresh-machine "$scratch" "$root" "$@"
