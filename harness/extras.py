"""Optional parts install as extras (`pip install 'diloco-chaos[docker]'`): a missing one
is one clear line naming the extra, not a traceback from deep inside a run."""
from __future__ import annotations

import importlib
from types import ModuleType

from diloco_chaos.harness.errors import UserError

# extra: (the package it installs, what needs it), for the extras harness/ guards. The
# others say so where they are imported: `browser` in reports/browser.py, `properties` in
# faults/strategies.py (faults/ imports nothing of harness/), `flax` in examples/flax_mlp.py.
EXTRAS = {"docker": ("docker", "the Docker backend (--backend docker, the multihost tier)")}


def require(module: str, extra: str) -> ModuleType:
    """`module` imported, or a UserError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package, what = EXTRAS[extra]
        raise UserError(f"{what} needs {package!r}, which is not installed ({e}); "
                        f"install it with: pip install 'diloco-chaos[{extra}]'") from None
