#!/usr/bin/env bash
# Prepares, on the development machine (Debian 12 x86-64, apt and PyPI reachable), everything that
# bench/gpu.sh needs on a bare GPU machine besides the CUDA toolkit, CMake, a C compiler and
# Python 3.12: the Debian packages of libzmq, libsodium, Jansson, OpenBLAS, Check, zlib and
# pkgconf with every shared library they load that a bare Ubuntu may lack (.deb files, still
# compressed; bench/gpu_deps.py unpacks them there under a private prefix), ninja, and the pyzmq
# wheel for CPython 3.12 on manylinux x86-64. All of it goes into one ignored folder:
#
#   bench/gpu-prep.sh [FOLDER]      (default .gpu-deps; made afresh)
#
# Then, on the GPU machine, with FOLDER carried: bash bench/gpu.sh (bench/README.md, "bench_gpu").
# Open MPI is not carried (about 10 MiB more with its libraries): the GPU machine has one GPU and
# the several-hosts case needs two, so bench/gpu.sh builds infeedd without MPI (-DIFD_MPI=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=${1:-.gpu-deps}
PYZMQ_VERSION=27.3.0 # the version scripts/deps.sh installs here at the time of writing
# Build-time packages (headers, .so links, .pc files) and what they load at run time. libc6,
# libgcc-s1 and libstdc++6 are on every machine that has a C compiler and are not carried; the
# check below fails when a carried library needs anything else that is not carried.
DEBS=(libzmq3-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
      libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1 libssl3
      libjansson-dev libjansson4
      libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
      check libsubunit-dev libsubunit0
      zlib1g-dev zlib1g
      pkgconf-bin libpkgconf3 ninja-build)
BASE_SONAMES="ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1
              libresolv.so.2 libgcc_s.so.1 libstdc++.so.6"

if [ "$(dpkg --print-architecture)" != amd64 ]; then
  echo "gpu-prep: expected an amd64 (x86-64) Debian machine, got $(dpkg --print-architecture):" \
       "the GPU machine is x86-64" >&2
  exit 1
fi
for tool in apt-get dpkg-deb readelf python3; do
  command -v "$tool" >/dev/null || { echo "gpu-prep: $tool is missing" >&2; exit 1; }
done

tmp="$dest.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/debs"
echo "gpu-prep: downloading ${#DEBS[@]} Debian packages"
# apt-get download writes into the current folder (as root it warns that _apt cannot: harmless)
if ! (cd "$tmp/debs" && apt-get download -q "${DEBS[@]}" >/dev/null 2>&1); then
  echo "gpu-prep: a package was not found; apt-get update, then again"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -q >/dev/null
  (cd "$tmp/debs" && apt-get download -q "${DEBS[@]}" >/dev/null)
fi

echo "gpu-prep: downloading pyzmq $PYZMQ_VERSION for CPython 3.12, manylinux x86-64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" "pyzmq==$PYZMQ_VERSION"

# Closure: every shared library a carried ELF file needs is carried or in BASE_SONAMES.
x="$tmp/x"
mkdir "$x"
for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$x"; done
have=$(find "$x" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)
missing=""
while IFS= read -r f; do
  for need in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if ! grep -qxF "$need" <<<"$have" && ! grep -qwF -- "$need" <<<"$BASE_SONAMES"; then
      missing+="  $need (needed by ${f#"$x"/})"$'\n'
    fi
  done
done < <(find "$x" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
           'head -c4 "$1" | grep -q ELF' _ {} \; -print)
rm -rf "$x"
# file names of letters, digits, '.', '_' and '-' only (the epoch's ':' arrives as '%3a')
for d in "$tmp"/debs/*.deb; do
  n=$(basename "$d" | tr -c 'A-Za-z0-9._\n-' '_')
  if [ "$n" != "$(basename "$d")" ]; then mv "$d" "$tmp/debs/$n"; fi
done
if [ -n "$missing" ]; then
  printf 'gpu-prep: these libraries are needed but not carried: add their packages to DEBS:\n%s' \
    "$missing" >&2
  exit 1
fi

{
  # shellcheck source=/dev/null
  echo "# bench/gpu-prep.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# file  bytes  sha256"
  (cd "$tmp" && find . -type f ! -name MANIFEST | sort | while read -r f; do
     echo "${f#./}  $(stat -c %s "$f")  $(sha256sum "$f" | cut -d' ' -f1)"
   done)
} >"$tmp/MANIFEST"
rm -rf "$dest"
mv "$tmp" "$dest"
echo "gpu-prep: $dest: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1)" \
     "($(du -sb "$dest" | cut -f1) bytes); carry it to the GPU machine and run bash bench/gpu.sh"
