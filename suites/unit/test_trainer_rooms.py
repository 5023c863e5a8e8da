"""trainer/'s rooms (docs/ARCHITECTURE.md "Layout and import direction"): numerics/ and wire/,
protocol/ above them, units/ on top; config.py and presets.py at the root. Read from the
source: a room's module takes no private name (a leading underscore) from a module of a
sibling room, imported or reached as an attribute; a room's __init__.py holds at most a
docstring (no re-exports: an importer names the module a name lives in); the protocol's
cores call their data-parallel and closing sides as collaborators, no mixin bases."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer"
ROOMS = ("numerics", "wire", "protocol", "units")


def room_of(module: str) -> str | None:
    """The room of `diloco_chaos.trainer.<room>.<module>`, None for anything else."""
    parts = module.split(".")
    if parts[:2] == ["diloco_chaos", "trainer"] and len(parts) > 2 and parts[2] in ROOMS:
        return parts[2]
    return None


def private_reaches(source: str, own_room: str) -> list[str]:
    """What a module of `own_room` takes private from a sibling room: `from <other room's
    module> import _x`, and `<alias>._x` on a module of another room it imported."""
    tree = ast.parse(source)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            room = room_of(node.module)
            if room is None or room == own_room:
                continue
            if node.module.count(".") == 2:  # `from diloco_chaos.trainer.<room> import <module>`
                aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            else:
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and room_of(a.name) not in (None, own_room)})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_the_reader_sees_private_names_of_a_sibling_room():
    src = ("from diloco_chaos.trainer.wire.transport import _tune, parse_addr\n"
           "from diloco_chaos.trainer.protocol import compression as c\n"
           "from diloco_chaos.trainer.numerics.tally import _b64\n"
           "def f():\n    return c._scale(1), c.encode\n")
    assert private_reaches(src, "numerics") == ["diloco_chaos.trainer.wire.transport._tune",
                                                "diloco_chaos.trainer.protocol.compression._scale"]
    assert private_reaches(src, "wire") == ["diloco_chaos.trainer.numerics.tally._b64",
                                            "diloco_chaos.trainer.protocol.compression._scale"]


def test_the_rooms_are_the_trainers_folders():
    assert sorted(p.name for p in TRAINER.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    assert sorted(p.name for p in TRAINER.glob("*.py")) == ["__init__.py", "config.py", "presets.py"]


def test_no_room_takes_a_private_name_of_a_sibling():
    wrong = {}
    for room in ROOMS:
        for path in sorted((TRAINER / room).glob("*.py")):
            if bad := private_reaches(path.read_text(), room):
                wrong[str(path.relative_to(ROOT))] = bad
    assert not wrong, f"private names taken across trainer/'s rooms: {wrong}"


def test_a_rooms_init_is_at_most_a_docstring():
    for init in [TRAINER / "__init__.py", *(TRAINER / room / "__init__.py" for room in ROOMS)]:
        body = ast.parse(init.read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), init


def test_the_cores_have_no_mixin_bases():
    from diloco_chaos.trainer.protocol.learner_core import LearnerCore
    from diloco_chaos.trainer.protocol.syncer_core import SyncerCore
    assert LearnerCore.__mro__ == (LearnerCore, object) and SyncerCore.__mro__ == (SyncerCore, object)
