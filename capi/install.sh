#!/bin/sh
# Installs libvfpoll: the shared and static libraries, the header and the pkg-config file.
#
#   cargo build --release -p vfpoll-capi
#   capi/install.sh PREFIX [PROFILE]        # PROFILE: release (default) or debug
#
# then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc prog.c $(pkg-config --cflags --libs vfpoll)
# (add -Wl,-rpath,PREFIX/lib, or run ldconfig, when PREFIX/lib is not on the loader's path).
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 PREFIX [release|debug]" >&2
    exit 2
fi
profile=${2:-release}
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${CARGO_TARGET_DIR:-$root/target}/$profile
for f in libvfpoll.so libvfpoll.a; do
    if [ ! -f "$lib/$f" ]; then
        flag=""
        [ "$profile" = release ] && flag=" --release"
        echo "$0: $lib/$f is missing: run \`cargo build$flag -p vfpoll-capi\` first" >&2
        exit 1
    fi
done
mkdir -p "$1/lib/pkgconfig" "$1/include"
prefix=$(cd "$1" && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
install -m 0755 "$lib/libvfpoll.so" "$prefix/lib/libvfpoll.so"
install -m 0644 "$lib/libvfpoll.a" "$prefix/lib/libvfpoll.a"
install -m 0644 "$root/capi/include/vfpoll.h" "$prefix/include/vfpoll.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$root/capi/vfpoll.pc.in" \
    >"$prefix/lib/pkgconfig/vfpoll.pc"
echo "installed libvfpoll $version into $prefix (pkg-config: $prefix/lib/pkgconfig/vfpoll.pc)"
