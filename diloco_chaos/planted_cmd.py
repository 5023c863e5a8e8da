"""`diloco-chaos planted`: the planted-bug catalogue, each bug with the check that catches
it, the evidence that check reads, and the test in `make test` that shows it caught in
the simulator and on real processes; then every check with the planted bug that proves
it can fail, on each tier (harness/judging/planted.py). `--json` for tools."""
from __future__ import annotations

import json


def register(sub, help_: str) -> None:
    p = sub.add_parser("planted", help=help_, description=__doc__)
    p.add_argument("--json", action="store_true", help="one JSON object per bug instead of the table")
    p.set_defaults(func=main)


def main(args) -> int:
    from diloco_chaos.harness.judging.planted import CATALOGUE, PROOFS, rows

    if args.json:
        for bug, p in sorted(CATALOGUE.items()):
            print(json.dumps({"bug": bug, **vars(p)}))
        for check, proofs in sorted(PROOFS.items()):
            print(json.dumps({"check": check, "proofs": [vars(p) for p in proofs]}))
        return 0
    for bug, owner, caught, evidence, sim, procs in rows():
        print(f"{bug}  ({owner})\n  {CATALOGUE[bug].does}\n  caught by   {caught}  [{evidence}]\n"
              f"  simulator   {sim}\n  processes   {procs}\n")
    print("every check, and the planted bug that fails it (simulator / processes):")
    for check, proofs in sorted(PROOFS.items()):
        for i, p in enumerate(proofs):
            print(f"  {check if i == 0 else '':<28} {p.bug:<24} {p.sim.split('::')[-1]}  /  {p.processes.split('::')[-1]}")
    print()
    missing = sum(1 for r in rows() if r[5] == "not yet")
    print(f"{len(CATALOGUE)} planted bugs; caught in the simulator: {len(CATALOGUE)}; "
          f"on real processes: {len(CATALOGUE) - missing} ({missing} not yet)")
    return 0
