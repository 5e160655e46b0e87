#!/usr/bin/env bash
# Rehearses the GPU check on this development machine, as on a bare GPU machine: runs
# `bash bench/gpu.sh --rehearse` in a private mount namespace (unshare -m; root) where this
# system's copies of everything .gpu-deps carries are hidden, with an empty environment (env -i:
# no LD_LIBRARY_PATH, PATH of a Python 3.12 venv with numpy and pytest only, the CUDA toolkit,
# /usr/bin and /bin), a fresh build folder and a fresh prefix. It ends at the first CUDA call
# (no GPU here) and at a smoke test of infeedd and the Python client on cpu.
#
#   bench/gpu-rehearse.sh [--no-dpkg] [--nccl-from-python]
#
# --no-dpkg: unpack the .deb files with Python, not dpkg-deb. --nccl-from-python: hide the
# toolkit's NCCL too, and put a stand-in of PyTorch's nvidia-nccl package (nvidia/nccl/lib and
# include, hard links to the toolkit's files) in the venv, as on a machine whose only NCCL is
# PyTorch's.
#
# Hidden (a bind mount of /dev/null over each file, so a use of one fails loudly): every file of
# the Debian packages in .gpu-deps/debs and of the -dev packages beside them (MPI's, pkg-config)
# that is installed here, except the runtime libraries that the tools the check runs (cmake,
# the compilers, nvcc, python3, ninja, tar, ...) load themselves; and every folder of system
# pkg-config files (a tmpfs over each). bench/gpu.sh's dependency step then shows, with ldd,
# that every carried library resolves inside its prefix. Results: build-gpu-rehearse/results.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/build-gpu-rehearse
no_dpkg=0
nccl_py=0
for a in "$@"; do
  case "$a" in
    --no-dpkg) no_dpkg=1 ;;
    --nccl-from-python) nccl_py=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-rehearse: unknown argument '$a': expected --no-dpkg, --nccl-from-python or" \
            "--help" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "gpu-rehearse: needs root (a mount namespace with bind mounts)" >&2
  exit 1
fi
if [ ! -d .gpu-deps/debs ]; then bash bench/gpu-prep.sh; fi

# A Python 3.12 with numpy and pytest and nothing else, as the GPU machine's python3.
venv=$work/venv
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c 'import numpy, pytest' 2>/dev/null; then
  py=""
  for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    # (a pyenv shim is on the PATH even where its version is not the global one: run it)
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys' >/dev/null 2>&1; then
      py=$(command -v "$c")
      break
    fi
  done
  if [ -z "$py" ]; then
    echo "gpu-rehearse: no Python 3.12 here (the carried pyzmq wheel is for 3.12)" >&2
    exit 1
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python3" -m pip install -q numpy pytest
fi

# The packages to hide: those carried, and the -dev packages and tools beside them.
mapfile -t carried < <(for d in .gpu-deps/debs/*.deb; do dpkg-deb -f "$d" Package; done)
extra=(pkgconf pkg-config libpkgconf3 pkgconf-bin libopenblas-dev libopenblas0 libopenblas0-openmp
       libopenblas-openmp-dev libopenblas0-serial libopenblas-serial-dev libsodium-dev libpgm-dev
       libnorm-dev libkrb5-dev libbsd-dev libmd-dev libssl-dev comerr-dev libgssrpc4
       libopenmpi-dev openmpi-bin libopenmpi3 ninja-build)
installed=()
for p in "${carried[@]}" "${extra[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    installed+=("$p")
  fi
done

# What the tools of the check load: their packages' files stay.
cc1=$(cc -print-prog-name=cc1)
tools=(cmake ctest cc "$cc1" "$(cc -print-prog-name=collect2)" "$(cc -print-prog-name=ld)"
       "$(cc -print-prog-name=as)" /usr/local/cuda/bin/nvcc /usr/local/cuda/bin/ptxas
       /usr/local/cuda/bin/fatbinary /usr/local/cuda/bin/nvlink /usr/local/cuda/bin/cudafe++
       /usr/local/cuda/nvvm/bin/cicc "$(readlink -f "$venv/bin/python3")" tar xz gzip dpkg-deb
       bash sed grep gawk mawk find sort tee timeout env date readlink dirname nproc uname)
tool_libs=$(for t in "${tools[@]}"; do
  f=$(command -v "$t" 2>/dev/null || echo "$t")
  [ -f "$f" ] && ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done
dynload=$("$venv/bin/python3" -c 'import sys, os; print(os.path.join(sys.base_prefix, "lib",
          "python%d.%d" % sys.version_info[:2], "lib-dynload"))')
find "$dynload" -name '*.so' -exec ldd {} \; 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' || true)
keep_pkgs=$(sort -u <<<"$tool_libs" | while read -r l; do
  dpkg -S "$(readlink -f "$l")" 2>/dev/null || dpkg -S "$l" 2>/dev/null || true
done | cut -d: -f1 | sed 's/,.*//' | sort -u)

hide_pkgs=()
kept=()
for p in "${installed[@]}"; do
  if grep -qxF "$p" <<<"$keep_pkgs"; then kept+=("$p"); else hide_pkgs+=("$p"); fi
done
files=$(for p in "${hide_pkgs[@]}"; do dpkg -L "$p"; done | sort -u | while read -r f; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi
done)
stand_in=$("$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nvidia
rm -rf "$stand_in"
if [ "$nccl_py" = 1 ]; then
  lib=$(readlink -f /usr/local/cuda/lib/libnccl.so.2)
  hdr=$(readlink -f /usr/local/cuda/include/nccl.h)
  mkdir -p "$stand_in/nccl/lib" "$stand_in/nccl/include"
  ln "$lib" "$stand_in/nccl/lib/libnccl.so.2" 2>/dev/null || cp "$lib" "$stand_in/nccl/lib/libnccl.so.2"
  cp "$hdr" "$stand_in/nccl/include/nccl.h"
  touch "$stand_in/nccl/__init__.py"
  files+=$'\n'$(for f in /usr/local/cuda*/lib*/libnccl* /usr/local/cuda*/targets/*/lib/libnccl* \
                          /usr/local/cuda*/include/nccl*.h /usr/local/include/nccl*.h; do
                   if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi
                 done | sort -u)
  echo "gpu-rehearse: the toolkit's NCCL hidden; a stand-in nvidia-nccl package in $stand_in"
fi
nfiles=$(wc -l <<<"$files")
echo "gpu-rehearse: hiding $nfiles files of ${#hide_pkgs[@]} installed packages: ${hide_pkgs[*]}"
echo "gpu-rehearse: left visible (the tools here load them; the build must still take the" \
     "carried copies): ${kept[*]:-none}"

rm -rf "$work/build" "$work/results"
mkdir -p "$work/results"
printf '%s\n' "$files" >"$work/hidden.txt"
export work venv no_dpkg
# shellcheck disable=SC2016 # expanded by the inner bash, from the exported variables
unshare -m --propagation private bash -c '
  set -euo pipefail
  while read -r f; do mount --bind /dev/null "$f"; done <"$work/hidden.txt"
  for d in /usr/lib/x86_64-linux-gnu/pkgconfig /usr/lib/pkgconfig /usr/share/pkgconfig \
           /usr/local/lib/pkgconfig; do
    if [ -d "$d" ]; then mount -t tmpfs none "$d"; fi
  done
  # the hiding works: the headers are empty, pkg-config does not run, no .pc file is left
  for h in /usr/include/zmq.h /usr/include/jansson.h /usr/include/check.h /usr/include/zlib.h; do
    if [ -s "$h" ]; then echo "gpu-rehearse: $h is still visible" >&2; exit 1; fi
  done
  if pkg-config --exists libzmq 2>/dev/null; then echo "gpu-rehearse: pkg-config still runs" >&2; exit 1; fi
  echo "gpu-rehearse: system headers, pkg-config and .pc files hidden; running bench/gpu.sh --rehearse"
  exec env -i HOME="$HOME" TERM=dumb PATH="$venv/bin:/usr/local/cuda/bin:/usr/bin:/bin" \
    OUT="$work/results" IFD_GPU_BUILD="$work/build" IFD_GPU_NO_DPKG="$no_dpkg" \
    bash bench/gpu.sh --rehearse
'
