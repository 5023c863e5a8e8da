"""The page's JavaScript: vega + vega-lite + vega-embed as one bundle, inlined in every page.

The bundle comes from `vl-convert-python` (the Vega project's own converter, which
ships these libraries and bundles them on request), for the Vega-Lite version the
installed Altair writes specs for. Bundling takes seconds, so the result is cached
on disk under ~/.cache/diloco-chaos/ (keyed by both versions) and in memory.
"""
from __future__ import annotations

import functools
import os
from importlib import metadata
from pathlib import Path

CACHE_DIR = Path.home() / ".cache" / "diloco-chaos"


def vl_version() -> str:
    """'6.4' for Altair's schema v6.4.1: the bundle must speak the specs' Vega-Lite."""
    import altair as alt

    return ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])


@functools.lru_cache(maxsize=None)
def vega_js(cache_dir: Path = CACHE_DIR) -> str:
    """The JS that defines window.vegaEmbed (and window.vega, window.vegaLite)."""
    key = f"vega-embed-vl{vl_version()}-vlc{metadata.version('vl-convert-python')}.js"
    path = cache_dir / key
    if path.exists():
        return path.read_text()
    import vl_convert

    js = vl_convert.javascript_bundle(vl_version=vl_version())
    if "</script" in js.lower():  # never end the inline <script> early
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(js)
        tmp.replace(path)
    except OSError:  # a read-only home still renders, only slower
        pass
    return js
