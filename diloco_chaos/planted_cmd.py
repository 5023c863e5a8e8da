"""`diloco-chaos planted`: the planted-bug catalogue, each bug with the check that catches
it, the evidence that check reads, and the test in `make test` that shows it caught in
the simulator and on real processes (harness/judging/planted.py). `--json` for tools."""
from __future__ import annotations

import json


def register(sub, help_: str) -> None:
    p = sub.add_parser("planted", help=help_, description=__doc__)
    p.add_argument("--json", action="store_true", help="one JSON object per bug instead of the table")
    p.set_defaults(func=main)


def main(args) -> int:
    from harness.judging.planted import CATALOGUE, rows

    if args.json:
        for bug, p in sorted(CATALOGUE.items()):
            print(json.dumps({"bug": bug, **vars(p)}))
        return 0
    for bug, owner, caught, evidence, sim, procs in rows():
        print(f"{bug}  ({owner})\n  {CATALOGUE[bug].does}\n  caught by   {caught}  [{evidence}]\n"
              f"  simulator   {sim}\n  processes   {procs}\n")
    missing = sum(1 for r in rows() if r[5] == "not yet")
    print(f"{len(CATALOGUE)} planted bugs; caught in the simulator: {len(CATALOGUE)}; "
          f"on real processes: {len(CATALOGUE) - missing} ({missing} not yet)")
    return 0
