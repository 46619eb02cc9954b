"""The charting library of the HTML report: Vega, Vega-Lite and vega-embed in one script, inlined once per page.

The script comes from vl-convert (the Vega project's own packaging of these libraries for offline use). Building
it takes vl-convert about two seconds, so it is built once per vl-convert version and kept in the user's cache
folder (STEPSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/stepscope, else ~/.cache/stepscope); a cache that cannot be
written only costs the rebuild.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

# Each bundle ends by exporting the three libraries; a cached file without this ending is rebuilt.
_BUNDLE_END = "window.vegaLite=__default1;"


def cache_dir() -> Path:
    configured = os.environ.get("STEPSCOPE_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stepscope"


@functools.cache
def vega_bundle() -> str:
    """The JavaScript of Vega + Vega-Lite + vega-embed (window.vega, window.vegaLite, window.vegaEmbed)."""
    import vl_convert

    # the module's own version (importlib.metadata would add ~30 ms of import to every report)
    version = getattr(vl_convert, "__version__", None)
    if not version:
        from importlib import metadata

        version = metadata.version("vl-convert-python")
    path = cache_dir() / f"vega-bundle-vl-convert-{version}.js"
    try:
        text = path.read_text(encoding="utf-8")
        if text.rstrip().endswith(_BUNDLE_END):
            return text
    except (OSError, UnicodeDecodeError):
        pass
    text = vl_convert.javascript_bundle()  # type: ignore[call-arg]  # its stub marks the optional snippet required
    if "</script" in text.lower():  # never seen; inlining would then end the script element early
        raise RuntimeError("the Vega bundle contains '</script': it cannot be inlined")
    _store(path, text)
    return text


def _store(path: Path, text: str) -> None:
    from stepscope.runfolder.atomic import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except OSError:
        pass


def csp_hash(script: str) -> str:
    """The Content-Security-Policy source that lets exactly this inline script run."""
    import base64

    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"
