#!/usr/bin/env python3
"""Turns each golden pass case optimizer/tests/golden/<pass>/<case>.txt (ONNX textual syntax,
onnx.parser.parse_model) into <case>.onnx next to it.

The .onnx files are committed so the Rust golden test (optimizer/tests/golden.rs) needs no
Python. A file is only rewritten when its bytes change, so re-running is a no-op. Leading
`# passes: ...` / `# options: ...` lines are read by the Rust test; the parser skips them as
comments.

Usage: scripts/gen_golden_models.py [CASE.txt ...]   (default: every case)
"""

import pathlib
import sys

import onnx
import onnx.parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "optimizer" / "tests" / "golden"


def convert(txt: pathlib.Path) -> bool:
    model = onnx.parser.parse_model(txt.read_text())
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString(deterministic=True)
    out = txt.with_suffix(".onnx")
    if out.exists() and out.read_bytes() == data:
        return False
    out.write_bytes(data)
    return True


def main() -> int:
    cases = [pathlib.Path(a) for a in sys.argv[1:]] or sorted(GOLDEN.glob("*/*.txt"))
    failed = 0
    for txt in cases:
        try:
            changed = convert(txt)
        except Exception as e:  # report every bad case, not only the first
            print(f"FAIL {txt.relative_to(ROOT)}: {e}", file=sys.stderr)
            failed += 1
            continue
        if changed:
            print(f"wrote {txt.with_suffix('.onnx').relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
