"""The GPU check's unpacker (bench/gpu_deps.py) and bench/gpu.sh's command line, without a GPU:
.deb files read without dpkg give the tree `dpkg-deb -x` gives (xz and gzip); the prefix has
/lib merged into /usr/lib, absolute links pointing inside it, .pc files moved under it without
Requires.private, and a pkg-config wrapper on its .pc files only; wheels install with pip or,
without pip, by unzipping; bad input is named. Packages are built here with dpkg-deb --build
(skipped where it is missing)."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_deps  # noqa: E402

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is missing")


def make_deb(tmp: Path, name: str, files: dict, links: dict, compress: str = "xz") -> Path:
    """A .deb of files {path: bytes} and symlinks {path: target}, built with dpkg-deb."""
    src = tmp / f"{name}-src"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        f"Description: test\n")
    for path, data in files.items():
        p = src / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if path.startswith("/usr/bin/"):
            p.chmod(0o755)
    for path, target in links.items():
        p = src / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)
    deb = tmp / f"{name}_{compress}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Z", compress, "--build", str(src),
                    str(deb)], check=True, capture_output=True)
    return deb


def tree(root: Path) -> list[tuple]:
    """(path, kind, mode, link target or content) of every entry under root."""
    out = []
    for p in sorted(gpu_deps.walk(root)):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out.append((rel, "l", 0, os.readlink(p)))
        elif stat.S_ISDIR(st.st_mode):
            out.append((rel, "d", stat.S_IMODE(st.st_mode), None))
        else:
            out.append((rel, "f", stat.S_IMODE(st.st_mode), p.read_bytes()))
    return out


LIB = "/usr/lib/x86_64-linux-gnu"
PC = """prefix=/usr
exec_prefix=${prefix}
libdir=${prefix}/lib/x86_64-linux-gnu
includedir=/usr/include/foo

Name: foo
Version: 1.2
Requires.private: krb5-gssapi libsodium
Libs: -L${libdir} -lfoo -L/usr/lib/extra -lextra
Libs.private: -lstdc++
Cflags: -I${includedir} -I/usr/include/foo/more -DX=/usr/share
"""


def sample_debs(tmp: Path, rng: random.Random, compress: str) -> list[Path]:
    blob = bytes(rng.randrange(256) for _ in range(rng.randint(1, 5000)))
    lib = make_deb(tmp, "libfoo1", {f"{LIB}/libfoo.so.1.0": blob,
                                    "/lib/x86_64-linux-gnu/libbar.so.2.0": blob[::-1]},
                   {f"{LIB}/libfoo.so.1": "libfoo.so.1.0",
                    "/lib/x86_64-linux-gnu/libbar.so.2": "libbar.so.2.0"}, compress)
    dev = make_deb(tmp, "libfoo-dev", {"/usr/include/foo/foo.h": b"int foo(void);\n",
                                       f"{LIB}/pkgconfig/foo.pc": PC.encode()},
                   {f"{LIB}/libfoo.so": "libfoo.so.1",
                    f"{LIB}/libbar.so": "/lib/x86_64-linux-gnu/libbar.so.2"}, compress)
    # a stand-in for pkgconf: prints where it would look and what it was asked
    tool = make_deb(tmp, "pkgconf-bin", {"/usr/bin/pkgconf": b"#!/bin/sh\necho "
                                         b"\"LIBDIR=$PKG_CONFIG_LIBDIR PATH=$PKG_CONFIG_PATH "
                                         b"LD=$LD_LIBRARY_PATH ARGS=$*\"\n"}, {}, compress)
    return [lib, dev, tool]


@needs_dpkg
@pytest.mark.parametrize("compress", ["xz", "gzip"])
def test_python_extraction_equals_dpkg(tmp_path, compress):
    rng = random.Random()
    for deb in sample_debs(tmp_path, rng, compress):
        a, b = tmp_path / f"a-{deb.stem}", tmp_path / f"b-{deb.stem}"
        gpu_deps.extract_deb(deb, a, use_dpkg=True)
        gpu_deps.extract_deb(deb, b, use_dpkg=False)
        assert tree(a) == tree(b), deb.name
        assert any(kind == "f" for _, kind, _, _ in tree(b))


@needs_dpkg
@pytest.mark.parametrize("use_dpkg", [True, False])
def test_unpack_makes_a_private_prefix(tmp_path, use_dpkg):
    deps = tmp_path / "deps"
    (deps / "debs").mkdir(parents=True)
    for deb in sample_debs(tmp_path, random.Random(), "xz"):
        shutil.copy(deb, deps / "debs")
    prefix = tmp_path / "prefix"
    (prefix / "stale").mkdir(parents=True)  # made afresh
    env = gpu_deps.unpack(deps, prefix, use_dpkg)
    assert not (prefix / "stale").exists()
    # /lib merged into /usr/lib; the -dev link that pointed at /lib/... now points inside
    assert (prefix / "lib").is_symlink() and os.readlink(prefix / "lib") == "usr/lib"
    lib = prefix / LIB.lstrip("/")
    assert (lib / "libbar.so.2.0").is_file() and not (lib / "libbar.so.2.0").is_symlink()
    assert os.readlink(lib / "libbar.so") == str(lib / "libbar.so.2")
    assert (lib / "libbar.so").resolve() == (lib / "libbar.so.2.0").resolve()
    assert (lib / "libfoo.so").resolve() == (lib / "libfoo.so.1.0").resolve()
    for p in gpu_deps.walk(prefix):
        if p.is_symlink():
            assert p.resolve().is_relative_to(prefix.resolve()), (p, os.readlink(p))
    # the .pc file: every path under the prefix, no Requires.private, the rest as it was
    pc = (lib / "pkgconfig" / "foo.pc").read_text()
    assert "Requires.private" not in pc
    assert f"prefix={prefix}/usr\n" in pc and f"includedir={prefix}/usr/include/foo\n" in pc
    assert f"-L{prefix}/usr/lib/extra -lextra" in pc
    assert f"-I{prefix}/usr/include/foo/more -DX=/usr/share" in pc
    assert "libdir=${prefix}/lib/x86_64-linux-gnu" in pc
    # env.sh and the pkg-config wrapper
    assert env["IFD_DEPS_LIBDIRS"] == str(lib)
    sh = subprocess.run(["sh", "-c", f". {prefix}/env.sh; echo $IFD_DEPS_PREFIX $IFD_DEPS_SITE "
                         f"$IFD_DEPS_PKG_CONFIG"], capture_output=True, text=True, check=True)
    assert sh.stdout.split() == [str(prefix), str(prefix / "site"), env["IFD_DEPS_PKG_CONFIG"]]
    clean = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([env["IFD_DEPS_PKG_CONFIG"], "--cflags", "foo"], capture_output=True,
                       text=True, check=True, env=dict(clean, PKG_CONFIG_PATH="/usr/x"))
    assert r.stdout.split() == [f"LIBDIR={lib / 'pkgconfig'}", "PATH=", f"LD={lib}",
                                "ARGS=--cflags", "foo"]


def make_wheel(tmp: Path, body: str) -> Path:
    whl = tmp / "tpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("tpkg/__init__.py", body)
        z.writestr("tpkg-1.0.data/purelib/tpkg_extra.py", "EXTRA = 2\n")
        z.writestr("tpkg-1.0.data/scripts/tpkg-tool", "#!/bin/sh\n")
        z.writestr("tpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tpkg\n"
                                                  "Version: 1.0\n")
        z.writestr("tpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                               "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("tpkg-1.0.dist-info/RECORD", "")
    return whl


@pytest.mark.parametrize("pip", [True, False])
def test_wheel_installs_with_or_without_pip(tmp_path, monkeypatch, pip):
    value = random.randrange(1 << 30)
    whl = make_wheel(tmp_path, f"VALUE = {value}\n")
    site = tmp_path / "site"
    if not pip:  # a Python without pip: `python -m pip --version` fails
        real = subprocess.run

        def no_pip(argv, *a, **kw):
            if argv[1:3] == ["-m", "pip"]:
                return subprocess.CompletedProcess(argv, 1, b"", b"No module named pip")
            return real(argv, *a, **kw)
        monkeypatch.setattr(gpu_deps.subprocess, "run", no_pip)
    elif subprocess.run([sys.executable, "-m", "pip", "--version"],
                        capture_output=True).returncode != 0:
        pytest.skip("this Python has no pip")
    how = gpu_deps.install_wheel(whl, site)
    assert how == ("pip" if pip else "unzip: no pip")
    r = subprocess.run([sys.executable, "-c", "import tpkg, tpkg_extra; "
                        "print(tpkg.VALUE, tpkg_extra.EXTRA, tpkg.__file__)"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(site)))
    assert r.returncode == 0, r.stderr
    v, extra, where = r.stdout.split()
    assert (int(v), int(extra)) == (value, 2) and where.startswith(str(site))


def test_a_wheel_pip_refuses_is_an_error(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("this Python has no pip")
    whl = tmp_path / "tpkg-1.0-cp30-abi3-manylinux_2_99_riscv.whl"
    shutil.copy(make_wheel(tmp_path, "VALUE = 1\n"), whl)
    with pytest.raises(ValueError, match=r"tpkg-1.0-cp30.*pip install --target .* failed with "
                                         r"Python 3"):
        gpu_deps.install_wheel(whl, tmp_path / "site")


def test_bad_packages_are_named(tmp_path):
    junk = tmp_path / "junk.deb"
    junk.write_bytes(b"PK\x03\x04 not an ar archive")
    with pytest.raises(ValueError, match=r"junk.deb: not a Debian package"):
        gpu_deps.extract_deb_py(junk, tmp_path / "x")
    # an ar archive with only a control member
    body = b"2.0\n"
    hdr = b"debian-binary/".ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + \
        b"100644".ljust(8) + str(len(body)).encode().ljust(10) + b"`\n"
    nodata = tmp_path / "nodata.deb"
    nodata.write_bytes(gpu_deps.AR_MAGIC + hdr + body)
    with pytest.raises(ValueError, match=r"nodata.deb: no data.tar member"):
        gpu_deps.extract_deb_py(nodata, tmp_path / "x")
    zst = tmp_path / "zst.deb"
    hdr = b"data.tar.zst".ljust(16) + hdr[16:]
    zst.write_bytes(gpu_deps.AR_MAGIC + hdr + body)
    with pytest.raises(ValueError, match=r"zst.deb: data.tar.zst is zstd-compressed"):
        gpu_deps.extract_deb_py(zst, tmp_path / "x")


def test_unpack_without_prep_says_what_to_run(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_deps.py"), "unpack", "--deps",
                        str(tmp_path / "none"), "--prefix", str(tmp_path / "p")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{tmp_path / 'none'}/debs: no .deb files: run bench/gpu-prep.sh first" in r.stderr


@pytest.mark.parametrize("script", ["gpu.sh", "gpu-prep.sh", "gpu-rehearse.sh"])
def test_scripts_parse_and_refuse_unknown_arguments(script):
    path = ROOT / "bench" / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    if script != "gpu-prep.sh":  # gpu-prep.sh's one argument is the folder
        r = subprocess.run(["bash", str(path), "--bogus"], capture_output=True, text=True)
        assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr, r.stderr
        h = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True)
        assert h.returncode == 0 and ("--rehearse" in h.stdout or "--no-dpkg" in h.stdout)


def test_gpu_sh_without_the_prep_folder_says_so(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--rehearse"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OUT=str(tmp_path / "out"),
                                IFD_GPU_BUILD=str(tmp_path / "build"),
                                IFD_GPU_DEPS=str(tmp_path / "missing")))
    assert r.returncode == 1, r.stdout
    assert "setup" in r.stdout and "FAILED" in r.stdout
    assert (f"{tmp_path / 'missing'}/debs is missing: run bench/gpu-prep.sh" in r.stdout
            or "is not installed" in r.stdout), r.stdout
    assert (tmp_path / "out" / "gpu.log").read_text() == r.stdout
