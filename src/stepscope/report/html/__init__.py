"""The self-contained HTML pages: `render_report(data)`, `render_compare(diff)`, `render_sections_page(...)` (the
memory page's), `write_html`.

Jinja2 renders the page with autoescaping on, so every string from a trace or a run folder is text, never markup.
The page loads nothing: the charting library (Vega-Lite, report/html/vega.py) and our own small script (table sorting
and filtering, chart embedding) are inlined, and a Content-Security-Policy lets only those two scripts run, by
their hashes, and forbids every load from elsewhere. Chart data rides in `application/json` script elements,
escaped so that no string can close them.
"""

from __future__ import annotations

import contextlib
import functools
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from stepscope.report._savings import combined_lines
from stepscope.report.data import ReportData
from stepscope.report.html import compare
from stepscope.report.html import findings as findings_section
from stepscope.report.html import sections as build
from stepscope.report.model import SECTION_TITLES, Charts, Section


def render_report(data: ReportData) -> str:
    """The report page of one run or trace."""

    pc = Charts()
    sections = build.sections(data, pc)
    findings = findings_section.findings(data)
    return _render(
        "report.html.j2",
        title=f"stepscope report: {data.title}",
        heading=data.title,
        subtitle=data.source,
        header=build.header_facts(data),
        findings=findings,
        combined_savings=combined_lines(data.analysis.ranks),
        sections=sections,
        notes=[*data.analysis.notices, *data.notes],
        charts=pc.specs,
        generated=data.generated,
    )


def render_compare(diff: Any) -> str:
    """The page of `stepscope report BASE --compare TEST`: the diff of two runs."""

    pc = Charts()
    sections = compare.compare_sections(diff, pc)
    return render_sections_page(
        title="stepscope compare",
        heading="Compare runs",
        subtitle=f"base {diff.base.path}  vs  test {diff.test.path}",
        header=compare.compare_header(diff),
        sections=sections,
        notes=list(diff.notices),
        charts=pc,
    )


def render_sections_page(
    *,
    title: str,
    heading: str,
    subtitle: str,
    header: list[tuple[str, str]],
    sections: list[Section],
    notes: list[str],
    charts: Charts,
) -> str:
    """A page of model sections with the report's look, script and charts (the compare page, the memory page)."""
    return _render(
        "sections.html.j2",
        title=title,
        heading=heading,
        subtitle=subtitle,
        header=header,
        findings=[],
        sections=sections,
        notes=notes,
        charts=charts.specs,
        generated="",
    )


def write_html(html: str, path: str | Path) -> Path:
    """Write the page atomically (a reader never sees half of it)."""
    from stepscope.runfolder.atomic import atomic_write_text

    return atomic_write_text(path, html)


# ------------------------------------------------------------------------------------------------ rendering
@functools.cache
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("stepscope.report", "templates"),
        bytecode_cache=_bytecode_cache(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["json_data"] = _json_data
    return env


def _bytecode_cache() -> Any:
    """Compiled templates kept beside the Vega bundle: compiling them costs each report ~60 ms otherwise. A cache
    that cannot be read or written is skipped."""
    import jinja2

    from stepscope.report.html.vega import cache_dir

    class Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except (OSError, EOFError, ValueError):
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    folder = cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return Cache(str(folder))


def _static(name: str) -> str:
    return resources.files("stepscope.report").joinpath("templates", name).read_text(encoding="utf-8")


def _json_data(value: Any) -> Any:
    """JSON for an `application/json` script element: `<`, `>`, `&` and the JS line separators escaped, so no
    string in it can end the element or open a comment."""
    from markupsafe import Markup

    text = msgspec.json.encode(value).decode("utf-8")
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return Markup(text)  # escaped above for its context (inside a JSON script element)


def _render(template: str, **context: Any) -> str:
    from markupsafe import Markup

    from stepscope.report.html.vega import csp_hash, vega_bundle

    vega = vega_bundle()
    app = _static("report.js")
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src {csp_hash(vega)} {csp_hash(app)}",
            "style-src 'unsafe-inline'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )
    return str(
        _environment()
        .get_template(template)
        .render(
            csp=csp,
            css=Markup(_static("report.css")),  # our own file
            vega_js=Markup(vega),  # the library, checked to hold no '</script'
            app_js=Markup(app),  # our own file
            section_titles=SECTION_TITLES,
            **context,
        )
    )
