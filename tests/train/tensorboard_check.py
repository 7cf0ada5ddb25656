#!/usr/bin/env python3
"""Checks a run's TensorBoard event files against its JSON-lines metrics file, read by TensorBoard itself.

    tensorboard_check.py METRICS.jsonl EVENTS_DIR [--steps FIRST..LAST]

Every numeric key of every JSON line except "step" and "time" must be a scalar of that tag at that
step in EVENTS_DIR, with the same value up to float32 rounding (relative 1e-6: TensorBoard stores a
simple_value as a float, and the JSON text may carry fewer digits than the double it came from; a
null, which is how the metrics file writes NaN and infinities, must be NaN or infinite there); no
tag or step may appear in one and not the other, and none twice. The files are loaded with
TensorBoard's EventAccumulator, orphaned-data purging on (its default), so a resumed run whose files
repeat steps passes only if its SessionLog START makes TensorBoard drop the repeats. With --steps,
the steps that carry any scalar must be exactly FIRST to LAST.
Exits 0 when they agree, 1 listing the differences, 2 on bad arguments, and 77 (a skipped test)
when tensorboard cannot be imported.
"""
import json
import math
import sys

REL_TOL = 1e-6
ABS_TOL = 1.2e-38  # below float32's smallest normal number, relative precision is gone


def read_jsonl(path):
    """{tag: {step: value}} and the problems found (duplicates, lines without a step)."""
    scalars, problems = {}, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{path}:{number}: not JSON ({e})")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                problems.append(f"{path}:{number}: no integer \"step\"")
                continue
            step = record["step"]
            for key, value in record.items():
                if value is None:  # how the metrics file writes NaN and infinities
                    value = math.nan
                if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if step in scalars.setdefault(key, {}):
                    problems.append(f"{path}:{number}: {key!r} at step {step} a second time")
                scalars[key][step] = float(value)
    return scalars, problems


def read_events(events_dir, event_accumulator):
    """{tag: {step: value}} as TensorBoard shows it, and the steps it shows more than once."""
    accumulator = event_accumulator.EventAccumulator(events_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    scalars, problems = {}, []
    for tag in accumulator.Tags().get("scalars", []):
        for event in accumulator.Scalars(tag):
            if event.step in scalars.setdefault(tag, {}):
                problems.append(f"{events_dir}: {tag!r} at step {event.step} more than once")
            scalars[tag][event.step] = float(event.value)
    return scalars, problems


def same(logged, shown):
    if math.isnan(logged):  # null in the metrics file: NaN or an infinity in the event file
        return not math.isfinite(shown)
    if math.isnan(shown):
        return False
    return math.isclose(logged, shown, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def main(argv):
    usage = "usage: tensorboard_check.py METRICS.jsonl EVENTS_DIR [--steps FIRST..LAST]"
    expected_steps = None
    if len(argv) == 5 and argv[3] == "--steps":
        first, _, last = argv[4].partition("..")
        if not (first.isdigit() and last.isdigit()):
            print(usage, file=sys.stderr)
            return 2
        expected_steps = set(range(int(first), int(last) + 1))
    elif len(argv) != 3:
        print(usage, file=sys.stderr)
        return 2
    jsonl, events_dir = argv[1], argv[2]
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        print(f"tensorboard_check: cannot import tensorboard ({e}); skipped (pip install tensorboard, "
              f"and point MT_PYTHON at that python)")
        return 77

    logged, problems = read_jsonl(jsonl)
    shown, shown_problems = read_events(events_dir, event_accumulator)
    problems += shown_problems
    if not logged:
        problems.append(f"{jsonl}: no scalars")
    count, steps = 0, set()
    for tag in sorted(set(logged) | set(shown)):
        want, got = logged.get(tag, {}), shown.get(tag, {})
        if not got:
            problems.append(f"{tag!r}: in {jsonl} but not in {events_dir}")
            continue
        if not want:
            problems.append(f"{tag!r}: in {events_dir} but not in {jsonl}")
            continue
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        if missing:
            problems.append(f"{tag!r}: steps {missing} of {jsonl} missing from {events_dir}")
        if extra:
            problems.append(f"{tag!r}: steps {extra} in {events_dir} are not in {jsonl}")
        for step in sorted(set(want) & set(got)):
            if not same(want[step], got[step]):
                logged_text = "null" if math.isnan(want[step]) else repr(want[step])
                problems.append(f"{tag!r} at step {step}: {logged_text} in {jsonl}, {got[step]!r} in {events_dir}")
            count += 1
            steps.add(step)
    if expected_steps is not None and steps != expected_steps:
        problems.append(f"steps {min(expected_steps)} to {max(expected_steps)} expected: missing "
                        f"{sorted(expected_steps - steps)}, extra {sorted(steps - expected_steps)}")

    if problems:
        for problem in problems[:30]:
            print(f"tensorboard_check: {problem}")
        if len(problems) > 30:
            print(f"tensorboard_check: ... and {len(problems) - 30} more")
        print(f"tensorboard_check: FAIL: {len(problems)} differences between {jsonl} and {events_dir}")
        return 1
    print(f"tensorboard_check: {count} scalars at {len(steps)} steps agree between {jsonl} and {events_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
