"""Print DistServe's Figure 6 beside the simulator's goodputs (prefill.plan.disagg_validation): the table
docs/planner.md quotes. Minutes: each goodput is bisected.

    PYTHONPATH=src python scripts/disagg_validation.py
"""

from __future__ import annotations

from prefill.plan.disagg_validation import goodputs, render_table

if __name__ == "__main__":
    print(render_table(goodputs()))
