#!/usr/bin/env python3
"""Plots one or several metrics files (the training programs' --metrics FILE) into one PNG.

  tools/plot_metrics.py RUN.jsonl [RUN2.jsonl ...] -o out.png [--title T] [--label NAME ...]

Each file is one run, drawn in its own colour and named in the legend by the file's stem (or by
--label, given once per file, in order). Four panels against the step: the loss (training as a
line, validation as dots of the same colour), the learning rate, tokens per second, and device
memory (peak and allocated GiB; runs on the CPU have none). Prints the PNG's path.

A metrics file holds one JSON object per line with "step", "time" (Unix seconds) and the scalars
logged at that step ("loss", "val_loss", "lr", "tokens_per_s", "mem_peak_gib", ...); null is a
NaN or infinite value and leaves a gap. A step seen again (a run resumed from a checkpoint)
replaces the earlier line. An unterminated last line that does not parse is a line still being
written, and is left out, so a running run can be plotted.

Exit status: 2 for a file that cannot be read or used (the message names FILE:LINE), 3 when
matplotlib is not installed.
"""
import argparse
import json
import math
import os
import subprocess
import sys

PROG = "plot_metrics"
SYSTEM_PYTHON = "/usr/bin/python3"
# Set when this script has re-run itself under SYSTEM_PYTHON, so that it does so only once.
REEXEC_MARK = "MT_PLOT_METRICS_SYSTEM_PYTHON"


class InputError(Exception):
    """A file that cannot be plotted; the message is "FILE:LINE: what is wrong" or "FILE: ..."."""


def read_run(path):
    """The records of one metrics file, {step: {key: float}}, in step order."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    lines = data.split(b"\n")
    terminated = data.endswith(b"\n")
    if terminated:
        lines.pop()  # the empty piece after the last newline
    records = {}
    for number, raw in enumerate(lines, start=1):
        last_unterminated = number == len(lines) and not terminated
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if last_unterminated:
                continue  # still being written
            raise InputError(f"{path}:{number}: bad JSON: {e}") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if "step" not in record:
            raise InputError(f'{path}:{number}: no "step" key')
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise InputError(f'{path}:{number}: "step" must be an integer, got {json.dumps(step)}')
        scalars = {}
        for key, value in record.items():
            if key == "step":
                continue
            if value is None:
                value = math.nan
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f'{path}:{number}: "{key}" must be a number or null, got {json.dumps(value)}')
            scalars[key] = float(value)
        records[step] = scalars  # a resumed run's line replaces the interrupted one's
    if not records:
        raise InputError(f"{path}: empty: no metrics lines")
    return dict(sorted(records.items()))


def series(records, key):
    """(steps, values) of the records that carry `key`."""
    points = [(step, r[key]) for step, r in records.items() if key in r]
    return [p[0] for p in points], [p[1] for p in points]


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        # Debian's python3-matplotlib is installed for the system interpreter; a python3 found
        # first on PATH (pyenv, a virtual environment) does not see it. Run under that one instead.
        if (os.environ.get(REEXEC_MARK) != "1" and os.access(SYSTEM_PYTHON, os.X_OK)
                and os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON)
                and subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0):
            os.environ[REEXEC_MARK] = "1"
            sys.stdout.flush()
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
        print(f"{PROG}: matplotlib is not installed (apt-get install python3-matplotlib, or pip install matplotlib)",
              file=sys.stderr)
        sys.exit(3)
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt


def empty_panel(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def plot(runs, output, title):
    """runs: [(label, records)]."""
    plt = import_pyplot()
    from matplotlib.lines import Line2D

    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 2, figsize=(14, 9), dpi=100)
    ax_loss, ax_lr, ax_tok, ax_mem = axes.flat
    drawn = {"loss": False, "lr": False, "tokens_per_s": False, "memory": False}

    for i, (label, records) in enumerate(runs):
        colour = colours(i % 10)
        steps, values = series(records, "loss")
        if steps:
            ax_loss.plot(steps, values, color=colour, linewidth=1.4)
            drawn["loss"] = True
        steps, values = series(records, "val_loss")
        if steps:
            ax_loss.plot(steps, values, color=colour, linestyle="none", marker="o", markersize=5)
            drawn["loss"] = True
        for key, ax in (("lr", ax_lr), ("tokens_per_s", ax_tok)):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, color=colour, linewidth=1.4)
                drawn[key] = True
        for key, style in (("mem_peak_gib", "-"), ("mem_allocated_gib", "--")):
            steps, values = series(records, key)
            if steps:
                ax_mem.plot(steps, values, color=colour, linestyle=style, linewidth=1.4)
                drawn["memory"] = True

    panels = (
        (ax_loss, "loss", "loss (line: training, dots: validation)", "no loss figures"),
        (ax_lr, "lr", "learning rate", "no learning-rate figures"),
        (ax_tok, "tokens_per_s", "tokens/s", "no throughput figures"),
        (ax_mem, "memory", "device memory, GiB (solid: peak, dashed: allocated)", "no device memory figures"),
    )
    for ax, key, heading, missing in panels:
        ax.set_title(heading, fontsize=11)
        if not drawn[key]:
            empty_panel(ax, missing)
            continue
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    if drawn["lr"]:
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    # One legend for the runs (colours), in the loss panel, or wherever something was drawn.
    handles = [Line2D([], [], color=colours(i % 10), linewidth=2, label=label) for i, (label, _) in enumerate(runs)]
    legend_ax = next((ax for ax, key, _, _ in panels if drawn[key]), ax_loss)
    legend_ax.legend(handles=handles, loc="best", fontsize=9)

    fig.suptitle(title or "metrics: " + ", ".join(label for label, _ in runs), fontsize=13)
    fig.tight_layout()
    try:
        fig.savefig(output, format="png")
    except OSError as e:
        raise InputError(f"{output}: cannot write: {e.strerror}") from None
    finally:
        plt.close(fig)


def main():
    p = argparse.ArgumentParser(prog="plot_metrics.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="metrics JSON-lines files, one run each")
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="the image to write")
    p.add_argument("--title", help="the figure's title (default: the runs' names)")
    p.add_argument("--label", action="append", metavar="NAME",
                   help="a run's name in the legend, once per file in order (default: the file's stem)")
    args = p.parse_args()
    if args.label is not None and len(args.label) != len(args.files):
        p.error(f"--label given {len(args.label)} times for {len(args.files)} files; give it once per file")
    labels = args.label or [os.path.splitext(os.path.basename(f))[0] for f in args.files]
    try:
        # Every file is read before matplotlib is loaded: bad input is reported without it.
        runs = [(label, read_run(path)) for label, path in zip(labels, args.files)]
        plot(runs, args.output, args.title)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
