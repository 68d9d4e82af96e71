"""Every code block the docs offer as a program runs as written (issue 44):
each ```python block of README.md and docs/*.md, and each ```c block there
that has a main(), on 2 ranks under weftrun, against this build tree. A
block that is only a fragment must not claim to be one of those: C without
main() is a fragment; every python block is a program.

  check_doc_snippets.py --source DIR --build DIR --python PY

The python blocks need torch and cffi in PY (the build tree's weft.torch is
found through WEFT_TORCH_EXT_DIR); where PY has no torch this exits 77,
skipped, saying so, after the C blocks ran.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
FENCE = re.compile(r"^```(\w+)\s*\n(.*?)^```\s*$", re.M | re.S)


def blocks(source):
    """(file, line, language, code) of every python and c block."""
    files = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    for path in files:
        text = open(path, encoding="utf-8").read()
        for m in FENCE.finditer(text):
            if m.group(1) in ("python", "c"):
                line = text.count("\n", 0, m.start()) + 1
                yield os.path.relpath(path, source), line, m.group(1), m.group(2)


def run_ranks(weftrun, argv, env, where):
    p = subprocess.run([weftrun, "-n", "2", "--timeout", "100"] + argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=150)
    status = "OK" if p.returncode == 0 else "FAILED (exit %d)" % p.returncode
    print("%s: %s" % (where, status), flush=True)
    if p.returncode != 0:
        print(p.stdout)
    return p.returncode == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--skip", default="", help="a reason to skip (a sanitizer build)")
    a = ap.parse_args()
    if a.skip:
        print("skipped: " + a.skip)
        return SKIP
    build = os.path.abspath(a.build)
    weftrun = os.path.join(build, "tools", "weftrun")
    env = dict(os.environ, PYTHONPATH=os.path.join(a.source, "python"), OMP_NUM_THREADS="1",
               WEFT_LIBRARY=os.path.join(build, "libweft.so"),
               WEFT_TORCH_EXT_DIR=os.path.join(build, "python", "csrc"), PYTHONDONTWRITEBYTECODE="1")
    has_torch = subprocess.run([a.python, "-c", "import torch, cffi"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    ok, ran, skipped = True, 0, []
    with tempfile.TemporaryDirectory(prefix="weft-snippets-") as tmp:
        for path, line, lang, code in blocks(a.source):
            where = "%s:%d (%s)" % (path, line, lang)
            if lang == "c":
                if not re.search(r"\bint\s+main\s*\(", code):
                    continue  # a fragment
                src = os.path.join(tmp, "snippet%d.c" % ran)
                exe = src[:-2]
                open(src, "w").write(code)
                cc = subprocess.run([a.cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(a.source, "include"),
                                     src, "-o", exe, "-L", build, "-lweft", "-Wl,-rpath," + build],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if cc.returncode != 0:
                    print("%s: does not compile:\n%s" % (where, cc.stdout))
                    ok = False
                    continue
                ok &= run_ranks(weftrun, [exe], env, where)
                ran += 1
            else:
                if not has_torch:
                    skipped.append(where)
                    continue
                src = os.path.join(tmp, "snippet%d.py" % ran)
                open(src, "w").write(code)
                ok &= run_ranks(weftrun, [a.python, src], env, where)
                ran += 1
    if not ok:
        return 1
    if skipped:
        print("skipped: %s has no torch and cffi, so these did not run: %s" % (a.python, ", ".join(skipped)))
        return SKIP
    print("%d snippets ran on 2 ranks" % ran)
    return 0


if __name__ == "__main__":
    sys.exit(main())
