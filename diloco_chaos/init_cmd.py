"""`diloco-chaos init [DIR]`: a folder to start from, which runs green as written:

    scenario.toml   a commented fault scenario (a kill and a partition, what must hold)
    my_task.py      a task stub meeting docs/TASKS.md (a linear regression: replace it with your model)
    test_chaos.py   a pytest test running the scenario through the `chaos` fixture
    conftest.py     puts the folder on PYTHONPATH, so every process of a run imports my_task

Files already there are never overwritten (the command says which, and writes nothing)."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from diloco_chaos.harness.errors import UserError

SUFFIX = ".tmpl"  # the templates are data, not modules of the package


def register(sub, help_: str) -> None:
    p = sub.add_parser("init", help=help_, description=__doc__.split("\n\n")[0].replace("`", ""))
    p.add_argument("dir", nargs="?", default="chaos", type=Path,
                   help="the folder to write (default ./chaos; made if missing)")
    p.set_defaults(func=cmd_init)


def templates() -> dict[str, str]:
    """file name -> text of each file `init` writes."""
    root = resources.files("diloco_chaos") / "templates" / "init"
    return {t.name.removesuffix(SUFFIX): t.read_text() for t in sorted(root.iterdir(), key=lambda t: t.name)
            if t.name.endswith(SUFFIX)}


def cmd_init(args) -> int:
    files = templates()
    taken = [name for name in files if (args.dir / name).exists()]
    if taken:
        raise UserError(f"{args.dir}: {', '.join(taken)} already there; nothing written "
                        f"(valid: a new or empty folder, e.g. diloco-chaos init {args.dir}-2)")
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.dir / name).write_text(text)
    print(f"wrote {', '.join(files)} in {args.dir}/\n"
          f"next:  cd {args.dir} && pytest                      (the simulator, ~15 s)\n"
          f"       diloco-chaos check scenario.toml             (the schedule, nothing run)\n"
          f"       pytest --chaos-tier cluster                  (real processes; after `diloco-chaos setup`)")
    return 0
