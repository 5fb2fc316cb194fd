"""A PNG of a run's held-out accuracy (val/rewards of a 0/1 reward) against the step, for the README and the docs.

    .venv/bin/python scripts/plot_accuracy.py runs/smollm2_arithmetic --out docs/smollm2-arithmetic.png

Reads RUN_DIR/metrics.jsonl. The minutes on the upper axis add up the steps' wall times (timers/step, which
include their validations): the run's time after its first validation, which comes after the model loads (and a
compilation). Drawn with Pillow (no plotting library needed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from aligner.metrics import TIMER_STEP, VAL_REWARD

METRIC = VAL_REWARD
STEP_TIMER = TIMER_STEP  # a step's wall time, its validation included
WIDTH, HEIGHT, MARGIN = 900, 520, 80
GRID, TEXT = (225, 225, 225), (40, 40, 40)
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189))  # the first: one run


def read_curve(run_dir: Path, metric: str = METRIC) -> list[tuple[int, float, float]]:
    """(step, minutes, value) of each validation; minutes: the steps' wall times (timers/step) summed up to it."""
    curve, seconds = [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        seconds += row.get(STEP_TIMER, 0.0)
        if metric in row:
            curve.append((row["step"], seconds / 60, row[metric]))
    return curve


def draw(curve: list[tuple[int, float, float]], title: str, out: Path) -> None:
    draw_curves({"": curve}, title, out)


def draw_curves(curves: dict[str, list[tuple[int, float | None, float]]], title: str, out: Path) -> None:
    """Each curve (label -> (step, minutes, value) points) in its own colour, with a legend when there are several.
    The minutes are drawn on the upper axis for a single curve only: runs side by side have their own clocks."""
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    d = ImageDraw.Draw(img)
    font, small = ImageFont.load_default(size=18), ImageFont.load_default(size=14)
    x0, y0, x1, y1 = MARGIN + 40, MARGIN, WIDTH - MARGIN // 2, HEIGHT - MARGIN  # room for the axis label
    points_of = [p for curve in curves.values() for p in curve]
    max_step = max(step for step, _, _ in points_of) or 1
    top = min(1.0, max(0.5, max(v for _, _, v in points_of) + 0.1))
    px = lambda step: x0 + (x1 - x0) * step / max_step  # noqa: E731
    py = lambda v: y1 - (y1 - y0) * v / top  # noqa: E731
    for tick in range(0, int(round(top * 100)) + 1, 10):
        d.line([(x0, py(tick / 100)), (x1, py(tick / 100))], fill=GRID)
        d.text((x0 - 8, py(tick / 100)), f"{tick}%", fill=TEXT, font=small, anchor="rm")
    for step in sorted({step for step, _, _ in points_of}):
        d.text((px(step), y1 + 8), str(step), fill=TEXT, font=small, anchor="mt")
    if len(curves) == 1:
        for step, minutes, _ in next(iter(curves.values())):
            d.text((px(step), y0 - 8), f"{minutes:.0f}", fill=TEXT, font=small, anchor="mb")
        d.text(((x0 + x1) // 2, y0 - 30), "minutes", fill=TEXT, font=small, anchor="mb")
    d.rectangle([x0, y0, x1, y1], outline=TEXT)
    for i, (label, curve) in enumerate(curves.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = [(px(step), py(v)) for step, _, v in curve]
        d.line(points, fill=colour, width=3)
        for x, y in points:
            d.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
        if len(curves) > 1:
            ly = y0 + 12 + 22 * i
            d.line([(x0 + 14, ly), (x0 + 44, ly)], fill=colour, width=3)
            d.text((x0 + 52, ly), label, fill=TEXT, font=small, anchor="lm")
    d.text((WIDTH // 2, 12), title, fill=TEXT, font=font, anchor="mt")
    d.text(((x0 + x1) // 2, y1 + 34), "step", fill=TEXT, font=font, anchor="mt")
    d.text((12, (y0 + y1) // 2), "held-out\naccuracy", fill=TEXT, font=small, anchor="lm")
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run folder (its metrics.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG file to write")
    parser.add_argument("--metric", default=METRIC, help="the validation metric to draw")
    parser.add_argument("--title", default="SmolLM2-135M-Instruct, arithmetic: held-out accuracy")
    args = parser.parse_args(argv)
    curve = read_curve(args.run_dir, args.metric)
    if not curve:
        parser.error(f"{args.run_dir / 'metrics.jsonl'} has no {args.metric}")
    draw(curve, args.title, args.out)
    print(f"wrote {args.out}: {len(curve)} validations, {curve[0][2]:.1%} -> {curve[-1][2]:.1%}")


if __name__ == "__main__":
    main()
