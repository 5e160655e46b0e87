"""Draws a run's loss, accuracy, examples/s and infeed wait against the global step (matplotlib,
Agg backend: no display needed).

    python -m infeed.plot run.jsonl -o run.png

The train summaries make the lines; eval summaries, when the file has any, are marked on the
loss and accuracy panels.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from .runlog import read_summaries, series

PANELS = (("loss", "loss"), ("accuracy", "accuracy"), ("examples_per_sec", "examples/s"),
          ("infeed_wait_fraction", "infeed wait (fraction of step time)"))


def plot(summaries: list, out: str, title: Optional[str] = None) -> dict:
    """Draws the train series of the summaries into the image file out (its extension picks the
    format). Returns the series drawn, {key: (steps, values)} (docs/summaries.md keys). Raises
    ValueError when there is no train summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = series(summaries, "train")
    if not train:
        events = sorted({str(s.get("event")) for s in summaries})
        raise ValueError(f"no train summaries to plot ({len(summaries)} summaries, events: "
                         f"{', '.join(events) or 'none'})")
    evals = series(summaries, "eval")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    drawn = {}
    for ax, (key, label) in zip(axes.flat, PANELS):
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
        if key in train:
            steps, values = train[key]
            ax.plot(steps, values, marker="." if len(steps) < 50 else None, label="train")
            drawn[key] = train[key]
        else:
            ax.text(0.5, 0.5, "not in these summaries", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
        if key in evals and key in ("loss", "accuracy"):
            ax.plot(*evals[key], "o", color="tab:red", label="eval")
            ax.legend()
        if key == "infeed_wait_fraction":
            ax.set_ylim(-0.02, 1.02)
    for ax in axes[1]:
        ax.set_xlabel("global step")
    end = [s for s in summaries if s.get("event") == "end" and s.get("mode") == "train"]
    head = title or "infeedd run"
    if end:
        head += f" (end: {end[-1].get('status')}, {end[-1].get('reason')}, global step " \
                f"{end[-1].get('global_step')})"
    fig.suptitle(head)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m infeed.plot",
        description="Draws loss, accuracy, examples/s and infeed wait against the global step "
                    "from infeedd's --summaries file.")
    ap.add_argument("summaries", metavar="RUN.jsonl", help="a --summaries JSON Lines file")
    ap.add_argument("-o", "--output", required=True, metavar="RUN.png",
                    help="the image to write (PNG, or any format matplotlib knows by extension)")
    ap.add_argument("--title", help="the figure's title")
    a = ap.parse_args(argv)
    try:
        drawn = plot(read_summaries(a.summaries), a.output, a.title)
    except ImportError as e:
        print(f"infeed.plot: {e}: pip install matplotlib", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"infeed.plot: {a.summaries}: {e}" if not str(e).startswith(a.summaries)
              else f"infeed.plot: {e}", file=sys.stderr)
        return 1
    n = len(next(iter(drawn.values()))[0])
    print(f"infeed.plot: {n} train summaries drawn into {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
