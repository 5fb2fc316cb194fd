"""The dashboard's charts: plotly figures (gr.Plot) of long-format metric frames (step, value, series).

Plotly rather than gr.LinePlot: a LinePlot keeps the series of its first data, so a chart drawn at step 0 (one
validation point) never showed the train series that came later. Every chart has integer step ticks, point markers,
values on hover to 4 significant digits, and the x range its caller gives (the same on every chart of a job).
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
HOVER = "%{fullData.name}<br>step %{x:d}: %{y:.4g}<extra></extra>"
MAX_TICKS = 10
HEIGHT = 280


def ema(values: list[float], smoothing: float) -> list[float]:
    """Exponential moving average, TensorBoard's smoothing: s_0 = v_0, s_t = a s_{t-1} + (1 - a) v_t (a = 0: raw)."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else smoothing * smoothed[-1] + (1 - smoothing) * value)
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
) -> go.Figure:
    """One chart of `frame` (step, value, series), a coloured line with markers per series. With `smoothing` > 0 the
    raw points are drawn faint and the EMA line solid; `log_y` is honoured only when every value is > 0 (the title
    says when it is not)."""
    fig = go.Figure()
    names = list(dict.fromkeys(frame["series"])) if len(frame) else []
    for i, name in enumerate(names):
        part = frame[frame["series"] == name].sort_values("step")
        color = (colors or {}).get(name, PALETTE[i % len(PALETTE)])
        steps, values = part["step"].tolist(), part["value"].tolist()
        smooth = 0 < smoothing < 1 and len(values) > 1
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                name=name if not smooth else f"{name} (raw)",
                mode="lines+markers",
                line={"color": color, "width": 1 if smooth else 2},
                marker={"color": color, "size": 5 if smooth else 6},
                opacity=0.3 if smooth else 1.0,
                hovertemplate=HOVER,
                legendgroup=name,
                showlegend=not smooth,
            )
        )
        if smooth:
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=ema(values, smoothing),
                    name=name,
                    mode="lines",
                    line={"color": color, "width": 2},
                    hovertemplate=HOVER,
                    legendgroup=name,
                )
            )
    log = log_y and log_scale_ok(frame)
    if log_y and not log and len(frame):
        title += " (linear: some values ≤ 0)"
    x_max = x_range[1] if x_range else (float(frame["step"].max()) if len(frame) else 1.0)
    x_min = x_range[0] if x_range else 0.0
    pad = max(0.3, (x_max - x_min) * 0.02)  # the first and last markers drawn whole
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=HEIGHT,
        margin={"l": 50, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
        hovermode="closest",
        template="plotly_white",
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
    return fig


def x_extent(max_steps: int | None, last_step: int | None, active: bool) -> tuple[float, float]:
    """The x range every chart of a job shares: 0..max_steps while it runs (the run's whole length), else 0..its
    last logged step."""
    if active and max_steps:
        return (0.0, float(max_steps))
    if last_step is None or (isinstance(last_step, float) and math.isnan(last_step)):
        return (0.0, float(max_steps or 1))
    return (0.0, float(max(1, last_step)))
