#!/usr/bin/env python3
"""Unpacks the folder bench/gpu-prep.sh fills (.gpu-deps/) into a private prefix, for bench/gpu.sh
on a machine that has the CUDA toolkit and Python but none of infeed's libraries, no package
registry, and perhaps no dpkg:

    python3 bench/gpu_deps.py unpack --deps .gpu-deps --prefix PREFIX [--no-dpkg]

- every debs/*.deb is extracted under PREFIX (never under /): with `dpkg-deb -x` where it exists,
  else (or with --no-dpkg) by reading the .deb here: an ar archive whose data.tar.{xz,gz,bz2}
  member holds the files (the standard library reads both; hand-written because it is 30 lines
  and no package can be installed there);
- PREFIX/lib, PREFIX/bin and PREFIX/sbin are merged into PREFIX/usr (Debian 12's libraries sit in
  /lib, its -dev symlinks in /usr/lib), and every absolute symlink (zlib1g-dev's libz.so points to
  /lib/x86_64-linux-gnu/libz.so.1.2.13) is pointed at the same file under PREFIX;
- every pkg-config file's paths are moved under PREFIX, and its Requires.private line is dropped
  (libzmq.pc names krb5-gssapi, libsodium, openpgm, norm and libbsd there, whose -dev packages only
  a static link needs; the shared link needs none of them);
- PREFIX/bin/pkg-config runs the carried pkgconf on the prefix's .pc files only;
- the wheels (*.whl) are installed into PREFIX/site (pip --target; a plain unzip where pip is
  missing);
- PREFIX/env.sh exports IFD_DEPS_PREFIX, IFD_DEPS_LIBDIRS (the folders of the shared libraries,
  colon-separated), IFD_DEPS_PKG_CONFIG (the wrapper) and IFD_DEPS_SITE for bench/gpu.sh.

Only the standard library: it runs on a bare machine. tests/bench/test_gpu_deps.py tests it.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

AR_MAGIC = b"!<arch>\n"


def walk(root: Path):
    """Every path under root, symlinks not followed (pathlib's rglob follows them before 3.13)."""
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            yield Path(d) / n


def deb_data_member(deb: Path) -> tuple[str, bytes]:
    """The name and bytes of the data.tar.* member of the ar archive deb."""
    blob = deb.read_bytes()
    if not blob.startswith(AR_MAGIC):
        raise ValueError(f"{deb}: not a Debian package (no ar header '!<arch>')")
    pos = len(AR_MAGIC)
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise ValueError(f"{deb}: broken ar member header at byte {pos}")
        name = header[0:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        body = blob[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            return name, body
        pos += 60 + size + (size & 1)  # members are padded to an even offset
    raise ValueError(f"{deb}: no data.tar member")


def extract_deb_py(deb: Path, dest: Path) -> None:
    """What `dpkg-deb -x deb dest` does, without dpkg."""
    name, body = deb_data_member(deb)
    if name.endswith(".zst"):
        raise ValueError(f"{deb}: {name} is zstd-compressed, which this Python cannot read; "
                         f"install dpkg or download the Debian (xz) package")
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
        if hasattr(tarfile, "tar_filter"):  # Python >= 3.12 (and late 3.8-3.11 releases)
            tar.extractall(dest, filter="tar")  # no member outside dest; links kept as they are
        else:  # pragma: no cover - older Pythons
            tar.extractall(dest)


def extract_deb(deb: Path, dest: Path, use_dpkg: bool) -> None:
    if use_dpkg:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    else:
        extract_deb_py(deb, dest)


def merge_usr(prefix: Path) -> None:
    """Moves PREFIX/{lib,bin,sbin} into PREFIX/usr and leaves symlinks in their place."""
    for top in ("lib", "bin", "sbin"):
        src = prefix / top
        if src.is_symlink() or not src.is_dir():
            continue
        dst = prefix / "usr" / top
        for path in sorted(walk(src)):
            rel = path.relative_to(src)
            target = dst / rel
            if path.is_dir() and not path.is_symlink():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.replace(path, target)
        shutil.rmtree(src)
        src.symlink_to(Path("usr") / top)


def fix_absolute_links(prefix: Path) -> list[tuple[str, str]]:
    """Points every absolute symlink under prefix at the same path under prefix (after the usr
    merge, /lib/... is PREFIX/usr/lib/...). Returns (link, new target) pairs."""
    fixed = []
    for link in sorted(walk(prefix)):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not target.startswith("/"):
            continue
        parts = Path(target).parts[1:]
        if parts and parts[0] in ("lib", "bin", "sbin"):
            parts = ("usr",) + parts
        new = prefix.joinpath(*parts)
        link.unlink()
        link.symlink_to(new)
        fixed.append((str(link.relative_to(prefix)), str(new)))
    return fixed


_PC_VAR = re.compile(r"^(\w+)=(/(?:usr|lib)\b.*)$")
_PC_FLAG = re.compile(r"(?<![\w/])(-[IL])(/(?:usr|lib)\b)")


def rewrite_pc(text: str, prefix: Path) -> str:
    """A .pc file's text with its absolute /usr and /lib paths moved under prefix and without its
    Requires.private line."""
    out = []
    for line in text.splitlines():
        if line.startswith("Requires.private:"):
            continue
        m = _PC_VAR.match(line)
        if m:
            line = f"{m.group(1)}={prefix}{m.group(2)}"
        elif re.match(r"^(Libs|Libs\.private|Cflags):", line):
            line = _PC_FLAG.sub(lambda f: f"{f.group(1)}{prefix}{f.group(2)}", line)
        out.append(line)
    return "\n".join(out) + "\n"


def pc_dirs(prefix: Path) -> list[Path]:
    return sorted({p.parent for p in walk(prefix) if p.suffix == ".pc" and not p.is_symlink()})


def lib_dirs(prefix: Path) -> list[Path]:
    """The folders under PREFIX/usr/lib that hold shared libraries (lib*.so*: .../openblas-pthread
    too, not the plugin folders of OpenSSL and Kerberos)."""
    root = prefix / "usr" / "lib"
    return sorted({p.parent for p in walk(root)
                   if p.name.startswith("lib") and ".so" in p.name and p.is_file()})


def write_pkg_config(prefix: Path, pcdirs: list[Path], libdirs: list[Path]) -> Path:
    pkgconf = prefix / "usr" / "bin" / "pkgconf"
    if not pkgconf.exists():
        raise FileNotFoundError(f"{pkgconf}: the carried pkgconf is missing (pkgconf-bin.deb)")
    wrapper = prefix / "bin" / "pkg-config"
    if prefix.joinpath("bin").is_symlink():  # after merge_usr: bin -> usr/bin
        wrapper = prefix / "usr" / "bin" / "pkg-config"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    libpath = ":".join(str(d) for d in libdirs)
    wrapper.write_text(
        "#!/bin/sh\n"
        "# bench/gpu_deps.py: the carried pkgconf, on this prefix's .pc files only\n"
        f"LD_LIBRARY_PATH={shlex.quote(libpath)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} \\\n"
        f"PKG_CONFIG_LIBDIR={shlex.quote(':'.join(str(d) for d in pcdirs))} PKG_CONFIG_PATH= \\\n"
        f"PKG_CONFIG_SYSROOT_DIR= exec {shlex.quote(str(pkgconf))} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def install_wheel(whl: Path, site: Path) -> str:
    """Installs whl into site with pip --target, or, where this Python has no pip, unzips it as
    pip would place its files. Returns how."""
    site.mkdir(parents=True, exist_ok=True)
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                            str(whl)], capture_output=True, text=True)
        if r.returncode != 0:
            raise ValueError(f"{whl.name}: pip install --target {site} failed with Python "
                             f"{sys.version.split()[0]}: {(r.stderr or r.stdout).strip()[-400:]}")
        return "pip"
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            # NAME.data/{purelib,platlib}/... belongs at the top (pip does the same)
            m = re.match(r"^[^/]+\.data/(purelib|platlib)/(.*)$", name)
            if m:
                name = m.group(2)
            elif re.match(r"^[^/]+\.data/", name):
                continue  # scripts, headers, data: not needed to import it
            if not name or name.endswith("/"):
                continue
            out = site / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                out.chmod(mode)
    return "unzip: no pip"


def unpack(deps: Path, prefix: Path, use_dpkg: bool) -> dict:
    debs = sorted((deps / "debs").glob("*.deb"))
    if not debs:
        raise FileNotFoundError(f"{deps}/debs: no .deb files: run bench/gpu-prep.sh first")
    if prefix.exists():
        shutil.rmtree(prefix)
    prefix.mkdir(parents=True)
    for deb in debs:
        extract_deb(deb, prefix, use_dpkg)
    merge_usr(prefix)
    fix_absolute_links(prefix)
    for pc in walk(prefix):
        if pc.suffix == ".pc" and not pc.is_symlink():
            pc.write_text(rewrite_pc(pc.read_text(), prefix))
    pcdirs, libdirs = pc_dirs(prefix), lib_dirs(prefix)
    wrapper = write_pkg_config(prefix, pcdirs, libdirs)
    site = prefix / "site"
    how = [f"{w.name} ({install_wheel(w, site)})" for w in sorted(deps.glob("*.whl"))]
    env = {"IFD_DEPS_PREFIX": str(prefix), "IFD_DEPS_LIBDIRS": ":".join(map(str, libdirs)),
           "IFD_DEPS_PKG_CONFIG": str(wrapper), "IFD_DEPS_SITE": str(site)}
    (prefix / "env.sh").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    print(f"gpu_deps: {len(debs)} packages unpacked into {prefix} "
          f"({'dpkg-deb' if use_dpkg else 'Python ar+tar'}); wheels: {', '.join(how) or 'none'}")
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unpack", help="unpack the debs and wheels of --deps into --prefix")
    u.add_argument("--deps", type=Path, required=True, help="the folder bench/gpu-prep.sh filled")
    u.add_argument("--prefix", type=Path, required=True,
                   help="the private prefix (made afresh; an absolute path is best)")
    u.add_argument("--no-dpkg", action="store_true",
                   help="read the .deb files here even where dpkg-deb exists")
    a = ap.parse_args(argv)
    use_dpkg = not a.no_dpkg and shutil.which("dpkg-deb") is not None
    try:
        unpack(a.deps, a.prefix.resolve(), use_dpkg)
    except (OSError, ValueError, subprocess.CalledProcessError, tarfile.TarError) as e:
        print(f"gpu_deps: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
