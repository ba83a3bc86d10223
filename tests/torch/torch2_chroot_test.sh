#!/bin/sh
# The torch backend against PyTorch 2.x (c10d::Backend), as a user of Debian 13 gets it: a
# Debian 13 (trixie) root file system made by debootstrap with python3-torch 2.x from Debian's
# archive; the checkout's tracked files copied in; `pip install --no-build-isolation ./python`
# into a venv builds the extension from scratch; then basic_test.py and the curated subset of
# PyTorch's own distributed suite run against the installed copy.
#
#   torch2_chroot_test.sh SOURCE_DIR WORK_DIR
#
# WORK_DIR/rootfs is kept between runs (debootstrap and the packages take minutes); delete it to
# start over. Needs root, debootstrap and Debian's archive; exits 77 (skipped) without them.
set -eu
src=$(cd "$1" && pwd) work=$2
suite=${PLEXUS_TORCH2_SUITE:-trixie}
mirror=${PLEXUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$work/rootfs

if [ "$(id -u)" != 0 ]; then echo "skipped: needs root (chroot, mounts)"; exit 77; fi
if ! command -v debootstrap >/dev/null; then
  echo "skipped: debootstrap is not installed (apt-get install debootstrap)"; exit 77
fi

mkdir -p "$work"
mounted=""
cleanup() {
  for m in $mounted; do umount -l "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
mount_in() {  # TYPE-or-bind SOURCE TARGET
  mkdir -p "$root/$3"
  if [ "$1" = bind ]; then mount --bind "$2" "$root/$3"; else mount -t "$1" "$2" "$root/$3"; fi
  mounted="$3 $mounted"
}

if [ ! -f "$root/.plexus-ready" ]; then
  rm -rf "$root"
  echo "== debootstrap $suite into $root"
  if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -5 "$work/debootstrap.log"
    echo "skipped: debootstrap $suite from $mirror failed (no access to Debian's archive?)"
    exit 77
  fi
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mount_in proc proc proc
  chroot "$root" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends build-essential cmake ninja-build pkg-config libabsl-dev libfmt-dev \
    nlohmann-json3-dev catch2 libcli11-dev libprotoc-dev protobuf-compiler python3-torch \
    libtorch-dev pybind11-dev python3-dev python3-venv python3-setuptools python3-numpy' \
    >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log"; exit 1; }
  touch "$root/.plexus-ready"
  cleanup; mounted=""
fi

mount_in proc proc proc
mount_in bind /dev dev
mount_in tmpfs tmpfs dev/shm
mount_in bind /sys sys

rm -rf "$root/root/plexus" "$root/root/venv"
mkdir -p "$root/root/plexus"
(cd "$src" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$root/root/plexus"

# Debian's torch 2.x is built without libuv, which its TCPStore asks for by default.
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USE_LIBUV=0 \
  OMP_NUM_THREADS=1 PLEXUS_BUILD_JOBS="$(nproc)" sh -ec '
  cd /root
  python3 -c "import torch; print(\"torch\", torch.__version__)"
  python3 -m venv --system-site-packages venv
  venv/bin/pip install --no-index --no-deps --no-build-isolation --quiet ./plexus/python
  cd /
  /root/venv/bin/python -c "import plexus_torch as p; assert p.base == \"Backend\", p.base; print(\"plexus_torch\", p.version, \"on c10d::\" + p.base)"
  PLEXUS_TORCH_EXPECT_INSTALLED=/root/venv /root/venv/bin/python /root/plexus/tests/torch/basic_test.py
  BACKEND=plexus WORLD_SIZE=2 /root/venv/bin/python /root/plexus/tests/torch/distributed_suite.py \
    -k DistributedDataParallelCPU -k subgroup -k _async -k send_recv -k any_source \
    --require-passed 12
'
