"""diloco-chaos: a chaos-engineering test harness for Decoupled DiLoCo training.

One import name: the design's folders are subpackages (`diloco_chaos.trainer`,
`diloco_chaos.faults`, `diloco_chaos.harness`, `diloco_chaos.reports`,
`diloco_chaos.examples`), resolved only through the installed package: a wheel holds them
under this package, an editable install (`make setup`) maps each top-level folder of the
checkout under it (pyproject.toml's package-dir, the one list of them). The CLI's own
modules (`diloco_chaos.cli`, ...) are the layer above harness/ and reports/
(docs/ARCHITECTURE.md).
"""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("diloco-chaos")
except _metadata.PackageNotFoundError:  # the package's tree on a path, not installed (a container's runtime)
    __version__ = "0+unknown"
