"""The report's Parallelism section: how the job's communication splits over its parallel dimensions (dp, tp,
...), and the tables of each kind of parallelism.

`TABLES` is the one list of what the section shows: a function of the report's data that returns a Table, or
None when the job has nothing of that kind. A new table of the section (FSDP units, pipeline stages, expert
parallel, ...) is one function added to it; the section is empty only when every function returns None.
"""

from __future__ import annotations

from collections.abc import Callable

from stepscope.report._expert_tensor import expert_table, tensor_table
from stepscope.report._fsdp import fsdp_table
from stepscope.report._pipeline import pipeline_page_table
from stepscope.report.data import ReportData
from stepscope.report.html import charts
from stepscope.report.model import SECTION_TITLES, Charts, Section, Table
from stepscope.report.tables import dimensions_table


def _dimensions(data: ReportData) -> Table | None:
    dims = data.analysis.dimensions
    return dimensions_table(dims) if dims is not None else None


def _fsdp(data: ReportData) -> Table | None:
    fsdp = data.analysis.fsdp
    return fsdp_table(fsdp, title="FSDP units") if fsdp is not None else None


def _expert(data: ReportData) -> Table | None:
    expert = data.analysis.expert
    return expert_table(expert, title="Expert parallel") if expert is not None else None


def _tensor(data: ReportData) -> Table | None:
    tensor = data.analysis.tensor
    return tensor_table(tensor, title="Tensor parallel") if tensor is not None else None


def _pipeline(data: ReportData) -> Table | None:
    return pipeline_page_table(data.analysis.pipeline)


TABLES: list[Callable[[ReportData], Table | None]] = [_dimensions, _fsdp, _expert, _tensor, _pipeline]


def parallelism(data: ReportData, pc: Charts) -> Section:
    s = Section("parallelism", SECTION_TITLES["parallelism"])
    dims = data.analysis.dimensions
    if dims is not None:
        pc.add(
            s,
            charts.horizontal_bars(
                [
                    {"dimension": d.dim, "part": part, "ms": value or 0.0}
                    for d in dims.job
                    for part, value in (
                        ("exposed", d.exposed_ms_per_step),
                        ("hidden", _hidden(d.time_ms_per_step, d.exposed_ms_per_step)),
                    )
                    if d.time_ms_per_step is not None
                ],
                label="dimension",
                value="ms",
                value_title="communication per step (ms, mean over the ranks)",
                color="part",
            ),
            "Communication per step by parallel dimension: exposed (the step waits on it) and hidden behind "
            "other work.",
        )
    s.tables.extend(t for make in TABLES if (t := make(data)) is not None)
    if not s.tables:
        s.empty = "no collectives in the traces (a single-process job, or collectives outside the window)"
    return s


def _hidden(time: float | None, exposed: float | None) -> float | None:
    return None if time is None or exposed is None else round(max(time - exposed, 0.0), 6)
