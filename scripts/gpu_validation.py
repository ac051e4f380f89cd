"""Write the planner's validation table into docs/planner.md, from tests/data/published_gpu.json and the model.

    PYTHONPATH=src python scripts/gpu_validation.py          # rewrite the table between the markers
    PYTHONPATH=src python scripts/gpu_validation.py --check  # exit 1 when the page differs from the model's table

The table is never typed: tests/plan/test_gpu_validation.py checks the page against this script's output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefill.plan.gpu_validation import check_all, load_misses, render_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "planner.md"
BEGIN, END = "<!-- validation table: scripts/gpu_validation.py -->", "<!-- end of validation table -->"


def page_with(table: str, text: str) -> str:
    """`text` with the part between the markers replaced by `table`."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = PAGE.read_text()
    new = page_with(render_table(check_all(), load_misses()), text)
    if args.check:
        if new != text:
            print(f"{PAGE} differs from the model's table: run scripts/gpu_validation.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
