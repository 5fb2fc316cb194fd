"""The dashboard's charts: plotly figures (gr.Plot) of long-format metric frames (step, value, series).

Plotly rather than gr.LinePlot: a LinePlot keeps the series of its first data, so a chart drawn at step 0 (one
validation point) never showed the train series that came later. Every chart has integer step ticks, point markers,
values on hover to 4 significant digits, and the x range its caller gives (the same on every chart of a job).

Series the caller names as `right` (the gold rewards, whose 0..1 scale a reward model's -2..5 would flatten) get a
y axis of their own on the right, with its own title and range.

A figure's `uirevision` (the caller's: stable per job and chart) names it across redraws, so that the user's zoom
outlives a redraw with new points. Plotly.js alone cannot do that here: Gradio's gr.Plot mounts a new plotly element
for every new figure (a keyed block), and plotly keeps user edits per element. KEEP_ZOOM_JS, run in the page
(`launch(js=...)`), keeps each uirevision's zoomed axis ranges, by axis and axis type, and sets them on the next
element of the same uirevision; a zoom back to the figure's own range (a double-click) forgets it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
HOVER = "%{fullData.name}<br>step %{x:d}: %{y:.4g}<extra></extra>"
MAX_TICKS = 10
HEIGHT = 280
# A series with fewer points is drawn raw whatever the smoothing: an EMA of a handful of validation points mostly
# shows how far back its weights reach, not a trend (the legend says so).
MIN_SMOOTH_POINTS = 10
UNSMOOTHED = f" (raw: < {MIN_SMOOTH_POINTS} points)"
RIGHT_AXIS = " (right axis)"
RIGHT_MARGIN = 60  # room for the right axis' ticks and title
# A note under a chart's title (e.g. the mismatch chart's advice): characters a line, about a narrow chart's width in
# the title's small type, and the height each line adds.
NOTE_LINE = 60
NOTE_LINE_PX = 16
KEEP_ZOOM_JS = """() => {
    const zooms = new Map();  // uirevision -> {axis: {range, type}}
    const RANGE = /^([xy]axis\\d*)\\.(range(\\[[01]\\])?|autorange)$/;
    const follow = (el) => {
        if (el.__keepZoom || !el.on || !el.layout || !el._fullLayout) return;
        el.__keepZoom = true;
        const key = el.layout.uirevision;
        if (!key) return;
        const own = {};  // the figure's own ranges, read before a relayout changes them
        for (const [name, axis] of Object.entries(el.layout)) {
            if (/^[xy]axis\\d*$/.test(name)) own[name] = JSON.stringify((axis || {}).range || null);
        }
        el.on("plotly_relayout", (change) => {
            const kept = zooms.get(key) || {};
            for (const attribute of Object.keys(change)) {
                const match = attribute.match(RANGE);
                if (!match) continue;
                const name = match[1], axis = el._fullLayout[name];
                if (!axis || change[name + ".autorange"] === true || JSON.stringify(axis.range) === own[name]) {
                    delete kept[name];
                } else {
                    kept[name] = {range: axis.range.slice(), type: axis.type};
                }
            }
            zooms.set(key, kept);
        });
        const again = {};
        for (const [axis, zoom] of Object.entries(zooms.get(key) || {})) {
            if (el._fullLayout[axis] && el._fullLayout[axis].type === zoom.type) again[axis + ".range"] = zoom.range;
        }
        if (Object.keys(again).length) window.Plotly.relayout(el, again);
    };
    const scan = () => document.querySelectorAll(".js-plotly-plot").forEach(follow);
    new MutationObserver(scan).observe(document.body, {childList: true, subtree: true});
}"""


def note_lines(note: str) -> list[str]:
    """A chart's note in lines of at most NOTE_LINE characters (plotly does not wrap a title), broken at spaces."""
    lines: list[str] = []
    for word in note.split():
        if lines and len(lines[-1]) + 1 + len(word) <= NOTE_LINE:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def ema(values: list[float], smoothing: float) -> list[float]:
    """TensorBoard's debiased exponential moving average (a = `smoothing`, 0: raw): from m_0 = 0,
    m_t = a m_{t-1} + (1 - a) v_t and s_t = m_t / (1 - a^t), t counting the finite values so far. Dividing by
    1 - a^t (the weight the zero start has not yet had) makes the weights of v_1..v_t sum to 1, so an early s_t is
    a mean of the points so far instead of a value dragged towards 0 or towards v_1. A non-finite value is kept as it
    is and does not count; a constant series is returned as it is (no rounding drift).

    Source: TensorBoard's `resmoothDataset` (tensorboard/components/vz_line_chart2/line-chart.ts), also what W&B's
    "exponential moving average" smoothing uses."""
    if not 0 < smoothing < 1 or len(set(values)) <= 1:
        return list(values)
    smoothed: list[float] = []
    last, count = 0.0, 0
    for value in values:
        if not math.isfinite(value):
            smoothed.append(value)
            continue
        last = smoothing * last + (1 - smoothing) * value
        count += 1
        smoothed.append(last / (1 - smoothing**count))
    return smoothed


def step_dtick(x_max: float) -> int:
    """An integer tick spacing (1, 2, 5, 10, 20, 50, ...) giving at most MAX_TICKS ticks over 0..x_max: with
    tickformat "d" alone plotly puts ticks at 0.5 and shows them as repeated integers."""
    span = max(1.0, float(x_max))
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if span / (factor * magnitude) <= MAX_TICKS:
                return factor * magnitude
        magnitude *= 10


def log_scale_ok(frame: pd.DataFrame) -> bool:
    """A log axis only when every value is > 0 (a KL or loss estimate may be 0 or negative: then linear)."""
    return len(frame) > 0 and bool((frame["value"] > 0).all())


def line_chart(
    frame: pd.DataFrame,
    title: str,
    y_title: str,
    smoothing: float = 0.0,
    log_y: bool = False,
    x_range: tuple[float, float] | None = None,
    colors: dict[str, str] | None = None,
    right: Sequence[str] = (),
    right_title: str = "",
    uirevision: str | None = None,
    note: str = "",
) -> go.Figure:
    """One chart of `frame` (step, value, series), a coloured line with markers per series. With `smoothing` > 0 the
    raw points of a series of at least MIN_SMOOTH_POINTS are drawn faint and its EMA line solid (a shorter one stays
    raw, its legend says why); `log_y` is honoured only when every value is > 0 (the title says when it is not) and
    applies to the left axis. The series named in `right` are drawn on a linear y axis on the right titled
    `right_title` when the chart has other series too; `uirevision` keeps the user's zoom across redraws; a `note`
    goes under the title, in smaller type, broken into lines of at most NOTE_LINE characters."""
    fig = go.Figure()
    names = list(dict.fromkeys(frame["series"])) if len(frame) else []
    on_right = {n for n in names if n in set(right)} if set(names) - set(right) else set()
    for i, name in enumerate(names):
        part = frame[frame["series"] == name].sort_values("step")
        color = (colors or {}).get(name, PALETTE[i % len(PALETTE)])
        steps, values = part["step"].tolist(), part["value"].tolist()
        wanted = 0 < smoothing < 1
        smooth = wanted and len(values) >= MIN_SMOOTH_POINTS
        label = name + (RIGHT_AXIS if name in on_right else "")
        axis = {"yaxis": "y2"} if name in on_right else {}
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                name=f"{label} (raw)" if smooth else label + (UNSMOOTHED if wanted else ""),
                mode="lines+markers",
                line={"color": color, "width": 1 if smooth else 2, "dash": "dot" if name in on_right else None},
                marker={"color": color, "size": 5 if smooth else 6},
                opacity=0.3 if smooth else 1.0,
                hovertemplate=HOVER,
                legendgroup=name,
                showlegend=not smooth,
                **axis,
            )
        )
        if smooth:
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=ema(values, smoothing),
                    name=label,
                    mode="lines",
                    line={"color": color, "width": 2, "dash": "dot" if name in on_right else None},
                    hovertemplate=HOVER,
                    legendgroup=name,
                    **axis,
                )
            )
    left = frame[~frame["series"].isin(on_right)] if len(frame) else frame
    log = log_y and log_scale_ok(left)
    if log_y and not log and len(left):
        title += " (linear: some values ≤ 0)"
    x_max = x_range[1] if x_range else (float(frame["step"].max()) if len(frame) else 1.0)
    x_min = x_range[0] if x_range else 0.0
    pad = max(0.3, (x_max - x_min) * 0.02)  # the first and last markers drawn whole
    lines = note_lines(note)
    text = title + "".join(f"<br><sup>{line}</sup>" for line in lines)
    fig.update_layout(
        title={"text": text, "font": {"size": 14}},
        height=HEIGHT + NOTE_LINE_PX * len(lines),
        margin={"l": 50, "r": RIGHT_MARGIN if on_right else 10, "t": 40 + NOTE_LINE_PX * len(lines), "b": 40},
        legend={"orientation": "h", "y": -0.25},
        hovermode="closest",
        template="plotly_white",
        uirevision=uirevision,
    )
    fig.update_xaxes(
        title_text="step",
        tickformat="d",
        tick0=0,
        dtick=step_dtick(x_max - x_min),
        range=[x_min - pad, max(x_max, x_min + 1) + pad],
    )
    # exponents as 2.5e-7, not SI prefixes (250n reads as nanoseconds)
    fig.update_yaxes(title_text=y_title, type="log" if log else "linear", exponentformat="e")
    if on_right:
        fig.update_layout(
            yaxis2={
                "title": {"text": right_title},
                "overlaying": "y",
                "side": "right",
                "type": "linear",
                "exponentformat": "e",
                "showgrid": False,
                "autorange": True,
            }  # fmt: skip
        )
    return fig


def x_extent(max_steps: int | None, last_step: int | None, active: bool) -> tuple[float, float]:
    """The x range every chart of a job shares: 0..max_steps while it runs (the run's whole length), else 0..its
    last logged step."""
    if active and max_steps:
        return (0.0, float(max_steps))
    if last_step is None or (isinstance(last_step, float) and math.isnan(last_step)):
        return (0.0, float(max_steps or 1))
    return (0.0, float(max(1, last_step)))
