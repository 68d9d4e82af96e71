"""docs/torch.md's table of supported calls against the backend's own methods
(issue 50), so that neither can drift from the other:

  - every method ProcessGroupWeft overrides (python/csrc/process_group_weft.hpp)
    is a row's "backend method", and every row's backend method is overridden;
  - every torch call the table names is called by a test of tests/torch
    (ranks.py, frameworks.py, launchers.py);
  - the methods the docs list as refused ("Anything torch's backend interface
    has and this list lacks (...)") are not overridden;
  - the reduce ops the docs name as supported are the ones the backend maps.

  check_calls_table.py --source DIR       exits 1 naming each difference
"""
import argparse
import os
import re
import sys

# overrides that are no call of torch.distributed's: the name, and the refusal
# of a receive from any source with weft's own sentence (docs: "What is refused")
NOT_CALLS = {"getBackendName", "recvAnysource"}


def overrides(hpp):
    text = open(hpp).read()
    body = text[text.index("class ProcessGroupWeft : "):]
    body = body[:body.index("\n};")]
    # "name(...) override": the name is the last identifier before the
    # parenthesis that opens a declaration ending in override
    names = set()
    for decl in re.finditer(r"(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*(?:const\s*)?override", body):
        names.add(decl.group(1))
    return names - NOT_CALLS - {"ProcessGroupWeft"}  # its destructor


def table(doc):
    """{backend method: [torch calls]} from the table whose header starts
    '| torch call | backend method |'."""
    lines = open(doc).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| torch call | backend method |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        calls = re.findall(r"`([\w.]+)`", cells[0])
        for m in re.findall(r"`(\w+)`", cells[1]):
            rows.setdefault(m, []).extend(calls)
    return rows


def refused_list(doc):
    text = open(doc).read()
    m = re.search(r"Anything torch's backend interface has and this list lacks \(([^)]*)\)", text)
    if not m:
        sys.exit("FAIL: docs/torch.md has no line \"Anything torch's backend interface has and this list lacks (...)\"")
    return set(re.findall(r"`(\w+)`", m.group(1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    hpp = os.path.join(a.source, "python", "csrc", "process_group_weft.hpp")
    cpp = os.path.join(a.source, "python", "csrc", "process_group_weft.cpp")
    doc = os.path.join(a.source, "docs", "torch.md")
    tests = os.path.join(a.source, "tests", "torch")
    have, rows = overrides(hpp), table(doc)
    faults = []
    for m in sorted(have - set(rows)):
        faults.append(f"the backend overrides {m}, which docs/torch.md's table does not list")
    for m in sorted(set(rows) - have):
        faults.append(f"docs/torch.md's table lists the backend method {m}, which the backend does not override")
    test_text = "".join(open(os.path.join(tests, f)).read()
                        for f in ("ranks.py", "frameworks.py", "launchers.py"))
    for m, calls in sorted(rows.items()):
        for call in calls:
            name = call.split(".")[-1]
            if not re.search(r"\b%s\(" % re.escape(name), test_text):
                faults.append(f"no test of tests/torch calls {name}() (the table's row for {m})")
    for m in sorted(refused_list(doc) & have):
        faults.append(f"docs/torch.md says {m} is refused, but the backend overrides it")
    # the ops: the docs' sentence names what reductionOf maps
    code = open(cpp).read()
    mapped = set(re.findall(r"case c10d::ReduceOp::(\w+): r\.op = ", code))
    if "case c10d::ReduceOp::PREMUL_SUM: break;" in code:
        mapped.add("PREMUL_SUM")
    m = re.search(r"\*\*Ops\*\*: ([^\n]*)", open(doc).read())
    named = set(re.findall(r"`(?:ReduceOp\.)?([A-Z_]+)`", m.group(1))) if m else set()
    if named != mapped:
        faults.append(f"docs/torch.md's **Ops** line names {sorted(named)}; the backend maps {sorted(mapped)}")
    for f in faults:
        print("FAIL: " + f)
    if faults:
        return 1
    print(f"docs/torch.md's table: {len(rows)} backend methods, each overridden and each call tested; "
          f"{len(refused_list(doc))} refused, none overridden; ops {sorted(mapped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
