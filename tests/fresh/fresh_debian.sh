#!/usr/bin/env bash
# The README's promise, checked on a machine that has never seen the project: a minimal
# Debian 12 root made by debootstrap, the source tree copied in (no build products), then
# `make demo` (once) and `make test` exactly as the README gives them, inside a chroot.
#
# Not part of `make test`: it downloads a Debian base system and every build dependency
# (about 700 MB) and takes 15-30 minutes. Needs root, debootstrap and a Debian mirror.
#
#   tests/fresh/fresh_debian.sh [ROOT] [MIRROR]     (ROOT defaults to /var/tmp/pdgw-fresh)
#   FRESH_STEPS="demo"  runs only the demo (default "demo test").
#
# Exit status: 0 when every step passed; the log of each step is ROOT/fresh-<step>.log.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
root=${1:-/var/tmp/pdgw-fresh}
mirror=${2:-http://deb.debian.org/debian}
steps=${FRESH_STEPS:-demo test}

if [[ $(id -u) != 0 ]]; then
    echo "SKIP fresh Debian check needs root (debootstrap, chroot, mounts)"
    exit 0
fi
if ! command -v debootstrap >/dev/null; then
    echo "SKIP debootstrap is not installed (apt-get install debootstrap)"
    exit 0
fi

mounted=()
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[$i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT

mount_into() { # type-or-bind source target
    mkdir -p "$3"
    if [[ $1 == bind ]]; then
        mount --bind "$2" "$3"
    else
        mount -t "$1" "$2" "$3"
    fi
    mounted+=("$3")
}

if [[ ! -x $root/usr/bin/apt-get ]]; then
    echo "fresh: debootstrap bookworm into $root (minbase)"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
        { tail -n 20 "$root.debootstrap.log"; exit 1; }
fi
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
# debootstrap leaves /etc/hosts to the installer; every installed Debian (and every container)
# has one naming localhost.
[[ -s $root/etc/hosts ]] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"

# Only tracked files: what a clone of the repository holds, no build directories.
rm -rf "$root/src/pdgw"
mkdir -p "$root/src/pdgw"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$src" ls-files -z | (cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$root/src/pdgw"
else
    tar -C "$src" --exclude='./build*' -cf - . | tar -xf - -C "$root/src/pdgw"
fi

mount_into proc proc "$root/proc"
mount_into sysfs sys "$root/sys"
mount_into bind /dev "$root/dev"
mount_into devpts devpts "$root/dev/pts"
mount_into tmpfs tmpfs "$root/dev/shm"

# A fresh machine has make (the README's commands start with it); nothing else is added.
if ! chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    DEBIAN_FRONTEND=noninteractive bash -c \
    'apt-get update -qq && apt-get install -y -qq make >/dev/null' >"$root/fresh-make.log" 2>&1; then
    echo "fresh: FAIL installing make in the new root:"
    tail -n 10 "$root/fresh-make.log"
    exit 1
fi

rc=0
for step in $steps; do
    case $step in
    demo) cmd='PDGW_DEMO_ONCE=1 make demo' ;;
    test) cmd='make test' ;;
    *) echo "fresh: unknown step $step" >&2; exit 2 ;;
    esac
    echo "fresh: $cmd (log $root/fresh-$step.log)"
    start=$(date +%s)
    if chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        DEBIAN_FRONTEND=noninteractive bash -c "cd /src/pdgw && $cmd" \
        >"$root/fresh-$step.log" 2>&1; then
        echo "fresh: PASS $step ($(($(date +%s) - start)) s)"
    else
        echo "fresh: FAIL $step ($(($(date +%s) - start)) s); last lines:"
        tail -n 30 "$root/fresh-$step.log"
        rc=1
    fi
done
exit $rc
