"""Vega-Lite specifications of the report's charts, built from the report's data (reshaping only, no analysis).

Each function returns a spec with its data inline, or None when there is nothing to draw. Vega-Lite draws them
in the browser; the page inlines the library once (report/html/vega.py).
"""

from __future__ import annotations

from typing import Any

from stepscope.analysis.per_rank.overview import CATEGORIES, CATEGORY_LABELS

Spec = dict[str, Any]

# One colour per overview category, as TensorBoard's overview had them; communication (not one of TensorBoard's)
# in purples, darkest where it is not split into waiting for peers and transfer.
COMM_WAIT_LABEL = "Communication: waiting"
COMM_TRANSFER_LABEL = "Communication: transfer"
CATEGORY_COLORS = {
    "Kernel": "#4e79a7",
    "Memcpy": "#f28e2b",
    "Memset": "#e15759",
    "Communication": "#7b4f75",
    COMM_WAIT_LABEL: "#d9b8d3",
    COMM_TRANSFER_LABEL: "#b07aa1",
    "Runtime": "#76b7b2",
    "DataLoader": "#59a14f",
    "CPU Exec": "#edc948",
    "Other": "#bab0ac",
}
HEIGHT = 220
# Steps are whole numbers: ticks on integers only (a 3-step run's axis otherwise reads 0.2, 0.4, ...).
STEP_AXIS = {"format": "d", "tickMinStep": 1}


def _base(values: list[dict[str, Any]], height: int = HEIGHT) -> Spec:
    return {
        "width": "container",
        "height": height,
        "data": {"values": values},
        "config": {"view": {"stroke": None}, "axis": {"labelLimit": 260}},
    }


def step_times(points: list[dict[str, Any]], windows: list[list[int]]) -> Spec | None:
    """Wall time of every step of the run, one line per rank, the profiled windows shaded; a red mark on the
    steps after which the job waited for stepscope (a window's end, a FLOP count's report), at their whole time
    by the job's clock (the step and stepscope's work after it)."""
    if not points:
        return None
    line = {
        "mark": {"type": "line", "point": len(points) <= 200, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "title": "step", "axis": STEP_AXIS},
            "y": {"field": "wall_ms", "type": "quantitative", "title": "step wall time (ms)"},
            "color": {"field": "rank", "type": "nominal", "title": "rank"},
            "tooltip": [
                {"field": "rank", "type": "nominal"},
                {"field": "step", "type": "quantitative"},
                {"field": "wall_ms", "type": "quantitative", "title": "ms", "format": ".3f"},
                {"field": "phase", "type": "nominal", "title": "profiler"},
            ],
        },
    }
    layers: list[Spec] = []
    if windows:
        layers.append(
            {
                "data": {"values": [{"first": w[0] - 0.5, "last": w[1] + 0.5} for w in windows]},
                "mark": {"type": "rect", "color": "#f28e2b", "opacity": 0.18},
                "encoding": {"x": {"field": "first", "type": "quantitative"}, "x2": {"field": "last"}},
            }
        )
    layers.append(line)
    if any(p.get("whole_ms") is not None for p in points):
        # the steps the job waited through stepscope's work after (a window's stop and export, a FLOP count's
        # report): how long by the job's own clock, a mark above the step's own time
        layers.append(
            {
                "transform": [{"filter": "datum.whole_ms != null"}],
                "mark": {"type": "point", "shape": "triangle-down", "filled": True, "size": 60, "tooltip": True},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative", "title": "step", "axis": STEP_AXIS},
                    "y": {"field": "whole_ms", "type": "quantitative"},
                    "color": {"value": "#e15759"},
                    "tooltip": [
                        {"field": "rank", "type": "nominal"},
                        {"field": "step", "type": "quantitative"},
                        {"field": "wall_ms", "type": "quantitative", "title": "step ms", "format": ".3f"},
                        {"field": "whole_ms", "type": "quantitative", "title": "with stepscope's work after it, ms",
                         "format": ".3f"},
                    ],
                },
            }
        )  # fmt: skip
    spec = _base(points)
    spec["layer"] = layers
    return spec


def category_parts(row: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, us) of one step's overview categories in their order; the communication as waiting for peers
    and transfer where the analysis split it."""
    parts = []
    for cat in CATEGORIES:
        if cat == "communication" and row.get("comm_wait_us") is not None:
            parts += [(COMM_WAIT_LABEL, row["comm_wait_us"]), (COMM_TRANSFER_LABEL, row["comm_transfer_us"])]
        else:
            parts.append((CATEGORY_LABELS[cat], row[f"{cat}_us"]))
    return parts


def step_categories(rows: list[dict[str, Any]], multi_rank: bool) -> Spec | None:
    """Stacked bars: each profiled step's wall time in the overview categories."""
    if not rows:
        return None
    values = []
    for row in rows:
        label = f"r{row['rank']} s{row['step']}" if multi_rank else str(row["step"])
        for category, us in category_parts(row):
            values.append(
                {
                    "step": label,
                    "category": category,
                    "order": list(CATEGORY_COLORS).index(category),
                    "ms": round(us / 1000, 4),
                }
            )
    shown = [c for c in CATEGORY_COLORS if any(v["category"] == c for v in values)]
    spec = _base(values, height=HEIGHT + 40)
    spec.update(
        {
            "mark": {"type": "bar", "tooltip": True},
            "encoding": {
                "x": {
                    "field": "step",
                    "type": "ordinal",
                    "title": "profiled step",
                    "sort": None,
                    "axis": {"labelAngle": 0},
                },
                "y": {"field": "ms", "type": "quantitative", "title": "time (ms)", "stack": "zero"},
                "color": {
                    "field": "category",
                    "type": "nominal",
                    "title": "category",
                    "scale": {"domain": shown, "range": [CATEGORY_COLORS[c] for c in shown]},
                },
                "order": {"field": "order", "type": "quantitative"},
                "tooltip": [
                    {"field": "step", "type": "ordinal"},
                    {"field": "category", "type": "nominal"},
                    {"field": "ms", "type": "quantitative", "format": ".3f"},
                ],
            },
        }
    )
    return spec


def horizontal_bars(
    values: list[dict[str, Any]], *, label: str, value: str, value_title: str, color: str | None = None
) -> Spec | None:
    """One bar per row, largest first (kernel types, collectives, modules). With `color`, the rows of one label
    (one per rank, or per run) stand side by side: each is its own figure, never added to the others."""
    if not values:
        return None
    spec = _base(values, height=max(60, 22 * len(values)))
    encoding: Spec = {
        "y": {"field": label, "type": "nominal", "sort": "-x", "title": None},
        "x": {"field": value, "type": "quantitative", "title": value_title, "stack": None},
        "tooltip": [
            {"field": k, "type": "quantitative" if isinstance(v, (int, float)) else "nominal"}
            for k, v in values[0].items()
        ],
    }
    if color is not None:
        encoding["color"] = {"field": color, "type": "nominal"}
        encoding["yOffset"] = {"field": color, "type": "nominal"}
    spec.update({"mark": {"type": "bar", "tooltip": True}, "encoding": encoding})
    return spec


def stacked_horizontal(values: list[dict[str, Any]], *, label: str, title: str) -> Spec | None:
    """Rows of (label, part, ms), one stacked bar per label (idle causes per stream, per-rank step parts)."""
    if not values:
        return None
    spec = _base(values, height=max(60, 28 * len({v[label] for v in values})))
    spec.update(
        {
            "mark": {"type": "bar", "tooltip": True},
            "encoding": {
                "y": {"field": label, "type": "nominal", "title": None, "sort": None},
                "x": {"field": "ms", "type": "quantitative", "title": title, "stack": "zero"},
                "color": {"field": "part", "type": "nominal", "title": None},
                "tooltip": [
                    {"field": label, "type": "nominal"},
                    {"field": "part", "type": "nominal"},
                    {"field": "ms", "type": "quantitative", "format": ".3f"},
                ],
            },
        }
    )
    return spec


def heatmap(values: list[dict[str, Any]], n_ranks: int) -> Spec | None:
    """Ranks x steps, coloured by step time: many ranks at a glance."""
    if not values:
        return None
    spec = _base(values, height=min(600, max(80, 14 * n_ranks)))
    spec.update(
        {
            "mark": {"type": "rect", "tooltip": True},
            "encoding": {
                "x": {"field": "step", "type": "ordinal", "title": "profiled step"},
                "y": {"field": "rank", "type": "ordinal", "title": "rank"},
                "color": {
                    "field": "ms",
                    "type": "quantitative",
                    "title": "step (ms)",
                    "scale": {"scheme": "orangered"},
                },
                "tooltip": [
                    {"field": "rank", "type": "ordinal"},
                    {"field": "step", "type": "ordinal"},
                    {"field": "ms", "type": "quantitative", "format": ".3f"},
                ],
            },
        }
    )
    return spec


def lines(
    values: list[dict[str, Any]],
    *,
    x: str,
    x_title: str,
    y_title: str,
    series: str = "series",
    area: bool = False,
    steps: bool = False,
) -> Spec | None:
    """Long-format rows (x, value, series) as lines (or stacked areas); with `steps`, each value holds until the
    next x (memory keeps its level until the next event)."""
    if not values:
        return None
    spec = _base(values)
    spec.update(
        {
            "mark": {
                "type": "area" if area else "line",
                "tooltip": True,
                **({} if area else {"point": False}),
                **({"interpolate": "step-after"} if steps else {}),
            },
            "encoding": {
                "x": {
                    "field": x,
                    "type": "quantitative",
                    "title": x_title,
                    **({"axis": STEP_AXIS} if x == "step" else {}),
                },
                "y": {
                    "field": "value",
                    "type": "quantitative",
                    "title": y_title,
                    **({"stack": "zero"} if area else {}),
                },
                "color": {"field": series, "type": "nominal", "title": None},
                "tooltip": [
                    {"field": series, "type": "nominal"},
                    {"field": x, "type": "quantitative"},
                    {"field": "value", "type": "quantitative", "format": ".4~s"},
                ],
            },
        }
    )
    return spec


def flame(boxes: list[dict[str, Any]], samples: int) -> Spec | None:
    """A flame graph: one rect per box (depth, start, end in samples), the outermost frame at the bottom, labelled
    where wide enough; the tooltip gives the function, file:line and its samples."""
    if not boxes or not samples:
        return None
    depth = max(b["depth"] for b in boxes) + 1
    spec = _base(boxes, height=max(80, 20 * depth))
    x = {"field": "start", "type": "quantitative", "title": "samples", "scale": {"domain": [0, samples]}}
    y = {"field": "depth", "type": "ordinal", "title": None, "sort": "descending", "axis": None}
    spec["layer"] = [
        {
            "mark": {"type": "rect", "stroke": "white", "strokeWidth": 0.5, "tooltip": True},
            "encoding": {
                "x": x,
                "x2": {"field": "end"},
                "y": y,
                "color": {
                    "field": "where",
                    "type": "nominal",
                    "legend": None,
                    "scale": {"scheme": "oranges"},
                },
                "tooltip": [
                    {"field": "function", "type": "nominal"},
                    {"field": "where", "type": "nominal", "title": "file:line"},
                    {"field": "samples", "type": "quantitative"},
                    {"field": "pct", "type": "quantitative", "title": "% of samples", "format": ".1f"},
                ],
            },
        },
        {
            "transform": [{"filter": f"datum.end - datum.start >= {samples / 12}"}],
            "mark": {"type": "text", "align": "left", "dx": 3, "fontSize": 10, "limit": 200},
            "encoding": {"x": x, "y": y, "text": {"field": "function"}},
        },
    ]
    return spec


# The critical path's kinds (analysis.whatif.path.PATH_KINDS, by their labels in the path's table) and host
# phases, in the overview's colours where they mean the same thing.
PATH_COLORS = {
    "GPU computation": CATEGORY_COLORS["Kernel"],
    "communication": CATEGORY_COLORS["Communication"],
    "GPU copies/fills": CATEGORY_COLORS["Memcpy"],
    "launch latency": CATEGORY_COLORS["Runtime"],
    "unexplained wait (not in the trace)": "#b07aa1",
    "collective dispatch (CPU backend)": "#a0cbe8",
    "gaps between kernels": "#d4d4d4",
    "synchronization (own time)": "#1f1f1f",
    "host: data_loader": CATEGORY_COLORS["DataLoader"],
    "host: forward": "#edc948",
    "host: backward": "#ff9da7",
    "host: optimizer": "#9c755f",
    "host: other": CATEGORY_COLORS["Other"],
}
ON_PATH = "on the critical path"
UNDER_PATH = "the work of the step"


def path_timeline(path: list[dict[str, Any]], busy: list[dict[str, Any]]) -> Spec | None:
    """One step as a timeline, a row per lane (a rank's host, then its streams): the step's work faint, the
    critical path over it in full colour and outlined. Each span: rank, lane, start_ms, end_ms, what (its label),
    name (or None)."""
    if not path:
        return None

    def row(s: dict[str, Any]) -> str:
        return f"rank {s['rank']} · {s['lane']}"

    def lane_order(s: dict[str, Any]) -> tuple[int, int, int, str]:
        # the host first, then streams by number ("stream 7" before "stream 23")
        number = [int(w) for w in s["lane"].split() if w.isdigit()]
        return (s["rank"], s["lane"] != "host", number[-1] if number else -1, s["lane"])

    order = list(dict.fromkeys(row(s) for s in sorted([*path, *busy], key=lane_order)))
    values = [{**s, "name": s.get("name") or "", "row": row(s), "layer": ON_PATH} for s in path] + [
        {**s, "name": s.get("name") or "", "row": row(s), "layer": UNDER_PATH} for s in busy
    ]
    shown = [w for w in PATH_COLORS if any(v["what"] == w for v in values)]
    shown += sorted({v["what"] for v in values} - set(shown))
    palette = [PATH_COLORS.get(w, "#bab0ac") for w in shown]
    encoding = {
        "x": {"field": "start_ms", "type": "quantitative", "title": "ms from the step's start"},
        "x2": {"field": "end_ms"},
        "y": {"field": "row", "type": "nominal", "title": None, "sort": order},
        "color": {
            "field": "what",
            "type": "nominal",
            "title": None,
            "scale": {"domain": shown, "range": palette},
            # below the rows, in columns: beside a chart of one or two rows the list was cut at its height (an
            # H200 job's path: host backward, optimizer and other drawn, their colours not named)
            "legend": {"symbolOpacity": 1, "orient": "bottom", "columns": 4},
        },
        "tooltip": [
            {"field": "row", "type": "nominal", "title": "lane"},
            {"field": "layer", "type": "nominal", "title": "shows"},
            {"field": "what", "type": "nominal"},
            {"field": "name", "type": "nominal"},
            {"field": "start_ms", "type": "quantitative", "title": "from (ms)", "format": ".3f"},
            {"field": "end_ms", "type": "quantitative", "title": "to (ms)", "format": ".3f"},
        ],
    }
    spec = _base(values, height=max(60, 26 * len(order)))
    spec["layer"] = [
        {
            "transform": [{"filter": f"datum.layer === '{UNDER_PATH}'"}],
            "mark": {"type": "bar", "opacity": 0.3, "tooltip": True},
            "encoding": encoding,
        },
        {
            "transform": [{"filter": f"datum.layer === '{ON_PATH}'"}],
            "mark": {"type": "bar", "stroke": "#222222", "strokeWidth": 1, "tooltip": True},
            "encoding": encoding,
        },
    ]
    return spec


def roofline(points: list[dict[str, Any]], roofs: list[dict[str, Any]]) -> Spec | None:
    """Op groups on log-log axes, FLOPs per byte against achieved TFLOP/s, one colour per family, a point's
    size its time; each number format's roof drawn (min(peak, bandwidth x intensity)) as a line."""
    if not points:
        return None
    spec = _base(points, height=360)
    x = {"field": "FLOP/byte", "type": "quantitative", "scale": {"type": "log"}, "title": "FLOPs per byte"}
    y = {"field": "TFLOP/s", "type": "quantitative", "scale": {"type": "log"}, "title": "achieved TFLOP/s"}
    layers: list[Spec] = [
        {
            "mark": {"type": "point", "filled": True, "opacity": 0.75, "tooltip": True},
            "encoding": {
                "x": x,
                "y": y,
                "color": {"field": "family", "type": "nominal", "title": "family"},
                "size": {"field": "ms", "type": "quantitative", "title": "time (ms)"},
                "tooltip": [
                    {"field": "op", "type": "nominal"},
                    {"field": "shapes", "type": "nominal"},
                    {"field": "ms", "type": "quantitative", "format": ".3f"},
                    {"field": "TFLOP/s", "type": "quantitative", "format": ".3g"},
                    {"field": "FLOP/byte", "type": "quantitative", "format": ".3g"},
                    {"field": "of roof", "type": "nominal"},
                ],
            },
        }
    ]
    if roofs:
        layers.insert(
            0,
            {
                "data": {"values": roofs},
                "mark": {"type": "line", "strokeDash": [4, 3], "color": "#555"},
                "encoding": {
                    "x": x,
                    "y": y,
                    "detail": {"field": "roof", "type": "nominal"},
                    "tooltip": [{"field": "roof", "type": "nominal"}],
                },
            },
        )
        layers.insert(
            1,
            {
                "data": {"values": [r for r in roofs if r.get("label")]},
                "mark": {"type": "text", "align": "right", "dy": -7, "color": "#555"},
                "encoding": {"x": x, "y": y, "text": {"field": "label"}},
            },
        )
    spec["layer"] = layers
    return spec
