"""Draws a run's loss, accuracy, examples/s and infeed wait against the global step (matplotlib,
Agg backend: no display needed).

    python -m infeed.plot run.jsonl -o run.png
    python -m infeed.plot run.jsonl --list
    python -m infeed.plot run.jsonl -o conf.png --scalar train/confidence/mean --scalar eval/loss

The train summaries make the lines; eval summaries, when the file has any, are marked on the
loss and accuracy panels. ``--scalar TAG`` draws any scalar instead, one panel each: the tags
``--list`` prints, those of python -m infeed.tensorboard (``EVENT/KEY``, and the host calls'
``EVENT/TENSOR/KEY``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from .runlog import read_summaries, scalars, series


def all_scalars(summaries: list) -> dict:
    """``{tag: (steps, values)}`` of every scalar of the summaries (runlog.scalars), in order."""
    out: dict = {}
    for s in summaries:
        for tag, step, value in scalars(s):
            steps, values = out.setdefault(tag, ([], []))
            steps.append(step)
            values.append(value)
    return out


def plot_scalars(summaries: list, tags: list, out: str, title: Optional[str] = None) -> dict:
    """Draws each scalar of tags (one panel each) against the global step into the image out.
    Returns {tag: (steps, values)}. Raises ValueError naming a tag the summaries do not have
    and the ones they have."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = all_scalars(summaries)
    missing = [t for t in tags if t not in have]
    if missing:
        raise ValueError(f"no scalar {', '.join(missing)} in these summaries; they have: "
                         f"{', '.join(sorted(have)) or 'none'}")
    fig, axes = plt.subplots(len(tags), 1, figsize=(9, 3 * len(tags)), sharex=True,
                             squeeze=False)
    for ax, tag in zip(axes[:, 0], tags):
        steps, values = have[tag]
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(tag)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("global step")
    fig.suptitle(title or "infeedd run")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return {t: have[t] for t in tags}

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
    ap.add_argument("-o", "--output", metavar="RUN.png",
                    help="the image to write (PNG, or any format matplotlib knows by extension)")
    ap.add_argument("--title", help="the figure's title")
    ap.add_argument("--scalar", action="append", metavar="TAG",
                    help="draw this scalar (EVENT/KEY or EVENT/TENSOR/KEY, as --list prints) "
                         "instead of the four panels; repeat for several")
    ap.add_argument("--list", action="store_true",
                    help="print the scalars the summaries have, with their counts, and exit")
    a = ap.parse_args(argv)
    if not a.list and not a.output:
        ap.error("-o/--output is required (or --list)")
    try:
        summaries = read_summaries(a.summaries)
        if a.list:
            for tag, (steps, _) in sorted(all_scalars(summaries).items()):
                print(f"{tag}\t{len(steps)}")
            return 0
        if a.scalar:
            drawn = plot_scalars(summaries, a.scalar, a.output, a.title)
        else:
            drawn = plot(summaries, a.output, a.title)
    except ImportError as e:
        print(f"infeed.plot: {e}: pip install matplotlib", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"infeed.plot: {a.summaries}: {e}" if not str(e).startswith(a.summaries)
              else f"infeed.plot: {e}", file=sys.stderr)
        return 1
    n = len(next(iter(drawn.values()))[0])
    what = f"{len(drawn)} scalars" if a.scalar else "train summaries"
    print(f"infeed.plot: {n} {what} drawn into {a.output}" if not a.scalar else
          f"infeed.plot: {what} ({n} points in the first) drawn into {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
