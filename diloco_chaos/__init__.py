"""diloco-chaos: a chaos-engineering test harness for Decoupled DiLoCo training.

One import name: the design's folders are subpackages (`diloco_chaos.trainer`,
`diloco_chaos.faults`, `diloco_chaos.harness`, `diloco_chaos.reports`,
`diloco_chaos.examples`). An installed wheel holds them under this package; in a checkout
they stay top-level folders beside diloco_chaos/, found through `__path__` below, so
`python -m diloco_chaos.trainer.learner` runs from the repository with only PYTHONPATH set
(the processes and containers the harness starts). The CLI's own modules
(`diloco_chaos.cli`, ...) are the layer above harness/ and reports/ (docs/ARCHITECTURE.md).
"""
from importlib import metadata as _metadata
from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
if not (_here / "trainer").is_dir() and (_here.parent / "trainer" / "learner.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821  (a checkout: the folders beside this one)

try:
    __version__ = _metadata.version("diloco-chaos")
except _metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, never installed
    __version__ = "0+checkout"
