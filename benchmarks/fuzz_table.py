"""The fuzz table of docs/reliability.md: run tests/test_fuzz.py at a larger scale and count outcomes.

    python benchmarks/fuzz_table.py             # MMPOS_FUZZ_SCALE=4: every damaged-folder variant
    python benchmarks/fuzz_table.py --scale 1   # what CI runs
    python benchmarks/fuzz_table.py --write     # also replace the table in docs/reliability.md

Each input of the suite is classified by ``tests/test_fuzz.py::_outcome`` (and the older coordinate and
encoder families by their own counters): ``clear`` (a ValueError / TypeError, or one CLI line with
exit 1 / 2, naming the argument or file), ``unhelpful`` (another exception, a message naming none of
them, or a CLI traceback), ``silent`` (a result that the independent check finds wrong) or ``valid``
(a result the check accepts). An unhelpful or silent input fails its test, so a passing run shows 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- fuzz-table:start -->", "<!-- fuzz-table:end -->"
OUTCOMES = ("clear", "unhelpful", "silent", "valid")


def render(data: dict, seconds: float, code: int, env: str) -> str:
    families = data["families"]
    lines = [
        "| family | inputs | clear | unhelpful | silent | valid | CLI tracebacks |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    total = dict.fromkeys(("tried", *OUTCOMES, "tracebacks"), 0)
    for name in sorted(families):
        row = families[name]
        for key in total:
            total[key] += row.get(key, 0)
        cells = [row.get(k, 0) for k in ("tried", *OUTCOMES, "tracebacks")]
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k in ("tried", *OUTCOMES, "tracebacks")) + " |")
    status = "all tests passed" if code == 0 else f"pytest exit status {code}: some inputs were unhelpful or silent"
    lines += [
        "",
        (
            f"`python benchmarks/fuzz_table.py --scale {data['scale']:g}`: {total['tried']} inputs in {seconds:.0f} s "
            f"({status}); {env}."
        ),
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=4.0, help="MMPOS_FUZZ_SCALE: examples per family x scale")
    p.add_argument("--write", action="store_true", help="replace the table in docs/reliability.md")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import hypothesis
    import numpy
    from _env import load, versions

    env = f"{versions(numpy, hypothesis)}; {load()}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fuzz.json"
        environ = {**os.environ, "MMPOS_FUZZ_SCALE": str(args.scale), "MMPOS_FUZZ_TABLE": str(out)}
        environ.setdefault("OMP_NUM_THREADS", "1")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/test_fuzz.py"]
        code = subprocess.run(cmd, cwd=ROOT, env=environ, check=False).returncode
        seconds = time.perf_counter() - t0
        if not out.exists():
            print("the suite wrote no counts (did it run?)", file=sys.stderr)
            return 1
        data = json.loads(out.read_text())
    table = render(data, seconds, code, env)
    print(table)
    if args.write:
        doc = ROOT / "docs" / "reliability.md"
        text = doc.read_text(encoding="utf-8")
        head, _, rest = text.partition(START)
        _, _, tail = rest.partition(END)
        doc.write_text(f"{head}{START}\n{table}\n{END}{tail}", encoding="utf-8")
        print(f"wrote {doc}")
    return code


if __name__ == "__main__":
    sys.exit(main())
