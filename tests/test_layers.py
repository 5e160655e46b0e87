"""The layering of the source tree: docs/design.md's map says what each folder may use; this
checks that the code does what the map says.

- Include arrows: every `#include "..."` of every .c/.h/.cu file, resolved as the compiler does
  (the file's own folder, then include/, then the tree's root), gives an arrow from the file's
  folder to the included file's folder; each arrow to another folder must be one the map allows.
  The public headers (include/infeed/) may be included from anywhere, except that core/ may not
  reach the runtime header include/infeed/infeed.h, directly or through another public header.
- Private headers: a file named *_internal.h is included only from its own folder (and from the
  folders that may use anything: tests, fuzzers).
- No circle: no file includes itself through other files (two files that include each other are
  the smallest circle).
- Symbol arrows: a library object that calls a function defined in another folder's object is an
  arrow too (a public header can hide one: hooks/ calling loop/ through infeed.h's
  declarations). With IFD_LAYERS_OBJECTS (folders of object files, separated by ':', as CTest
  sets it), `nm` reads them.

python3 tests/test_layers.py prints the table of folder -> folder arrows and what breaks the
map; CTest runs it with pytest (test `layers`), and the self-tests below show each check
failing on a small tree that breaks it.
"""

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP_HEADING = "## The map"
PUBLIC = "include/infeed/"
RUNTIME_HEADER = "include/infeed/infeed.h"
SOURCE_SUFFIXES = (".c", ".h", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
FOLDER_RE = re.compile(r"`([a-z_/]+/)`")


def read_map(design_md):
    """{folder: set of folders it may use, or None for anything} from the map's table."""
    text = Path(design_md).read_text()
    start = text.index(MAP_HEADING)
    allowed = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        folders = FOLDER_RE.findall(cells[0])
        may = cells[-1]
        uses = None if "anything" in may else set(FOLDER_RE.findall(may))
        for f in folders:
            allowed[f] = uses
    if not allowed:
        raise ValueError(f"{design_md}: no table under '{MAP_HEADING}'")
    return allowed


def folder_of(path, folders):
    """The longest folder of the map that holds path (a path relative to the root), or None."""
    best = None
    for f in folders:
        if path.startswith(f) and (best is None or len(f) > len(best)):
            best = f
    return best


def source_files(root, folders):
    out = []
    for f in folders:
        base = root / f
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(root).as_posix()
            hidden = any(part.startswith(".") for part in rel.split("/"))  # .venv-peers, .gpu-deps
            if (p.suffix in SOURCE_SUFFIXES and p.is_file() and "/build" not in "/" + rel
                    and not hidden):
                out.append(rel)
    return out


def includes(root, files):
    """{file: [included files]}, each resolved as the compiler does; unresolved ones skipped."""
    graph = {}
    for rel in files:
        here = (root / rel).parent
        found = []
        for name in INCLUDE_RE.findall((root / rel).read_text(errors="replace")):
            for cand in (here / name, root / "include" / name, root / name):
                if cand.is_file():
                    found.append(cand.resolve().relative_to(root.resolve()).as_posix())
                    break
        graph[rel] = found
    return graph


def reaches(graph, start, target):
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f == target:
            return True
        if f in seen:
            continue
        seen.add(f)
        todo.extend(graph.get(f, []))
    return False


def include_arrows(root, allowed):
    """(arrows {(from, to): [example 'file -> file']}, problems [sentences], graph)."""
    folders = list(allowed)
    graph = includes(root, source_files(root, folders))
    arrows = collections.defaultdict(list)
    problems = []
    for src, dsts in graph.items():
        a = folder_of(src, folders)
        for dst in dsts:
            b = folder_of(dst, folders)
            if b is None or a == b:
                continue
            arrows[(a, b)].append(f"{src} -> {dst}")
            if dst.endswith("_internal.h") and allowed[a] is not None:
                problems.append(f"{src} includes {dst}, private to {b} (a module's interface "
                                f"header is named for what it is)")
            if b == PUBLIC:
                if a == "core/" and reaches(graph, dst, RUNTIME_HEADER):
                    problems.append(f"{src} includes {dst}, which is (or includes) the runtime "
                                    f"header {RUNTIME_HEADER}: core/ sits below it")
                continue
            if allowed[a] is not None and b not in allowed[a]:
                problems.append(f"{src} includes {dst}: {a} may use "
                                f"{', '.join(sorted(allowed[a])) or 'no other folder'}, not {b}")
    return arrows, problems, graph


def circles(graph):
    """Each include circle once, as a list of files (Tarjan's strongly connected components)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, []):
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def object_files(root, dirs):
    """{source path relative to the root: object file} from CMake object folders, each given as
    DIR or DIR=SRC (SRC: the folder, relative to the root, its target's sources are named from,
    as host/'s targets name theirs). Objects whose source is gone (an old build's) are left out."""
    out = {}
    for spec in dirs:
        d, _, prefix = spec.partition("=")
        d = Path(d)
        for o in sorted(d.rglob("*.o")):
            rel = o.relative_to(d).as_posix()[:-2]  # core/batch.c.o -> core/batch.c
            rel = re.sub(r"^(__/)+", "", rel)
            if prefix and not rel.startswith(prefix.rstrip("/") + "/"):
                rel = prefix.rstrip("/") + "/" + rel
            if (root / rel).is_file():
                out.setdefault(rel, o)
    return out


def symbol_arrows(objects, allowed):
    """(arrows {(from, to): ['file -> file: symbol']}, problems) from nm's defined and undefined
    symbols."""
    folders = list(allowed)
    defined, undefined = {}, {}
    for src, obj in objects.items():
        text = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True,
                              check=True).stdout
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            if kind == "U":
                undefined.setdefault(src, set()).add(name)
            elif kind in "TDBRVWC":
                defined.setdefault(name, src)
    arrows = collections.defaultdict(list)
    problems = []
    for src, names in undefined.items():
        a = folder_of(src, folders)
        for name in sorted(names):
            dst = defined.get(name)
            b = folder_of(dst, folders) if dst else None
            if a is None or b is None or a == b:
                continue
            arrows[(a, b)].append(f"{src} -> {dst}: {name}")
            if allowed[a] is not None and b not in allowed[a]:
                problems.append(f"{src} calls {name} of {dst}: {a} may use "
                                f"{', '.join(sorted(allowed[a])) or 'no other folder'}, not {b}")
    return arrows, problems


def table(arrows):
    lines = []
    for (a, b), why in sorted(arrows.items()):
        lines.append(f"  {a:14} -> {b:18} {len(why):4}  e.g. {why[0]}")
    return "\n".join(lines)


def check(root, objects_dirs=()):
    allowed = read_map(root / "docs" / "design.md")
    arrows, problems, graph = include_arrows(root, allowed)
    for c in circles(graph):
        problems.append("include circle: " + " -> ".join(c + [c[0]]))
    sym_arrows = {}
    if objects_dirs:
        sym_arrows, sym_problems = symbol_arrows(object_files(root, objects_dirs), allowed)
        problems += sym_problems
    return arrows, sym_arrows, problems


def objects_from_env():
    return [d for d in os.environ.get("IFD_LAYERS_OBJECTS", "").split(":") if d]


# ---- the checks on this tree ----------------------------------------------------------------


def test_the_tree_follows_the_map():
    dirs = objects_from_env()
    for d in dirs:
        d = d.partition("=")[0]
        assert Path(d).is_dir(), f"IFD_LAYERS_OBJECTS names {d}, which is not a folder"
    arrows, sym_arrows, problems = check(ROOT, dirs)
    assert arrows, "no include arrow found: the tree was not read"
    if dirs:
        assert sym_arrows, "no symbol arrow found in the objects of " + ", ".join(dirs)
    assert not problems, "\n".join(problems)


# ---- the checks fail where they should (small trees under tmp_path) --------------------------

SMALL_MAP = """# Design
## The map

| folder | owns | may use |
| --- | --- | --- |
| `include/infeed/` | public headers | |
| `core/` | basics | libc |
| `low/` | a layer | `core/` |
| `high/` | a layer | `core/`, `low/` |
| `tests/` | tests | anything |

## After
"""


def small_tree(tmp_path, files):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(SMALL_MAP)
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


GOOD = {
    "include/infeed/error.h": "",
    "include/infeed/infeed.h": '#include "infeed/error.h"\n',
    "core/a.h": '#include "infeed/error.h"\n',
    "low/b.c": '#include "core/a.h"\n#include "b.h"\n',
    "low/b.h": "",
    "high/c.c": '#include "low/b.h"\n#include "infeed/infeed.h"\n',
    "tests/t.c": '#include "high/c.c"\n',
}


def test_a_tree_that_follows_the_map_passes(tmp_path):
    arrows, _, problems = check(small_tree(tmp_path, GOOD))
    assert problems == []
    assert set(arrows) == {("core/", PUBLIC), ("low/", "core/"), ("high/", "low/"),
                           ("high/", PUBLIC), ("tests/", "high/")}


def test_an_upward_include_fails(tmp_path):
    files = dict(GOOD, **{"low/b.h": '#include "high/c.h"\n', "high/c.h": ""})
    _, _, problems = check(small_tree(tmp_path, files))
    assert len(problems) == 1 and "low/b.h includes high/c.h" in problems[0], problems


def test_core_reaching_the_runtime_header_fails(tmp_path):
    files = dict(GOOD, **{"core/a.h": '#include "infeed/infeed.h"\n'})
    _, _, problems = check(small_tree(tmp_path, files))
    assert len(problems) == 1 and "runtime header" in problems[0], problems


def test_another_modules_internal_header_fails(tmp_path):
    files = dict(GOOD, **{"low/b_internal.h": "", "high/c.c": '#include "low/b_internal.h"\n',
                          "tests/t.c": '#include "low/b_internal.h"\n'})
    _, _, problems = check(small_tree(tmp_path, files))
    assert len(problems) == 1 and "high/c.c includes low/b_internal.h" in problems[0], problems


def test_two_files_that_include_each_other_fail(tmp_path):
    files = dict(GOOD, **{"low/b.h": '#include "low/d.h"\n', "low/d.h": '#include "b.h"\n'})
    _, _, problems = check(small_tree(tmp_path, files))
    assert problems == ["include circle: low/b.h -> low/d.h -> low/b.h"], problems


def test_an_upward_call_fails(tmp_path):
    root = small_tree(tmp_path, GOOD)
    objs = tmp_path / "objs"
    for name, text in {"low/b.c": "int high_fn(void);\nint low_fn(void) { return high_fn(); }\n",
                       "high/c.c": "int low_fn(void);\nint high_fn(void) { return 1; }\n"
                                   "int high_other(void) { return low_fn(); }\n"}.items():
        (objs / name).parent.mkdir(parents=True, exist_ok=True)
        src = objs / (name + ".src.c")
        src.write_text(text)
        subprocess.run(["cc", "-c", str(src), "-o", str(objs / (name + ".o"))], check=True)
    _, sym_arrows, problems = check(root, [str(objs)])
    assert ("high/", "low/") in sym_arrows and ("low/", "high/") in sym_arrows
    assert len(problems) == 1 and "low/b.c calls high_fn of high/c.c" in problems[0], problems


if __name__ == "__main__":
    inc, sym, probs = check(ROOT, objects_from_env() or sys.argv[1:])
    print("include arrows (folder -> folder, files, an example):")
    print(table(inc))
    if sym:
        print("symbol arrows (folder -> folder, calls, an example):")
        print(table(sym))
    print("\n".join(["problems:"] + probs) if probs else "no upward arrow, no circle")
    sys.exit(1 if probs else 0)
