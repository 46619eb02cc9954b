"""The charting library of the HTML report: Vega, Vega-Lite and vega-embed in one script, inlined once per page.

The script is a file of the package (templates/vega.js), read as text: writing a page starts no JavaScript
engine (one started at run time died under `ulimit -v` or dropped capabilities with a V8 dump, exit 133). The
file is vl-convert's bundle of these libraries (the Vega project's own packaging of them for offline use), made
by `make vega-bundle`, which runs `python -m stepscope.report.html.vega` on a machine with vl-convert-python.
Their licences: templates/vega.LICENSES.txt.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

BUNDLE_NAME = "vega.js"
# Each bundle ends by exporting the three libraries; a file without this ending is not one.
_BUNDLE_END = "window.vegaLite=__default1;"


def cache_dir() -> Path:
    """The user's cache folder for stepscope (compiled templates): STEPSCOPE_CACHE_DIR, else
    $XDG_CACHE_HOME/stepscope, else ~/.cache/stepscope."""
    from stepscope.analysis.read.cache import base

    return base()


@functools.cache
def vega_bundle() -> str:
    """The JavaScript of Vega + Vega-Lite + vega-embed (window.vega, window.vegaLite, window.vegaEmbed)."""
    from importlib import resources

    text = resources.files("stepscope.report").joinpath("templates", BUNDLE_NAME).read_text(encoding="utf-8")
    check_bundle(text)
    return text


def check_bundle(text: str) -> None:
    """Raise StepscopeError (one line from the CLI) unless `text` is a whole bundle that can be inlined in a
    script element."""
    from stepscope.errors import StepscopeError

    if not text.rstrip().endswith(_BUNDLE_END):
        raise StepscopeError(f"the Vega bundle ({BUNDLE_NAME}) is cut short: reinstall stepscope")
    if "</script" in text.lower():  # never seen; inlining would then end the script element early
        raise StepscopeError("the Vega bundle contains '</script': it cannot be inlined")


def build_bundle(path: Path) -> None:
    """Write vl-convert's bundle to `path`, headed by where it came from (for `make vega-bundle`)."""
    import vl_convert

    from stepscope.runfolder.atomic import atomic_write_text

    version = getattr(vl_convert, "__version__", None)
    if not version:
        from importlib import metadata

        version = metadata.version("vl-convert-python")
    body = vl_convert.javascript_bundle()  # type: ignore[call-arg]  # its stub marks the optional snippet required
    check_bundle(body)
    head = (
        f"/* Vega, Vega-Lite and vega-embed as vl-convert-python {version} bundles them (make vega-bundle). "
        "Licences: vega.LICENSES.txt */\n"
    )
    atomic_write_text(path, head + body)


def csp_hash(script: str) -> str:
    """The Content-Security-Policy source that lets exactly this inline script run."""
    import base64

    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


if __name__ == "__main__":  # python -m stepscope.report.html.vega [PATH]: (re)build the shipped bundle
    build_bundle(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "templates" / BUNDLE_NAME
    )
