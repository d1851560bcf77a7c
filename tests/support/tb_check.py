"""Reads a run's TensorBoard event files with TensorBoard's own reader
(EventAccumulator) and compares them with its metrics.jsonl: every number of
every record (nested objects as key/sub; "step" is the step) must be a scalar
at that step equal to the value rounded to float32 (a step logged twice by a
restart: its last value), once, and no other scalar may exist; with --spec, the text "spec" must hold that file's text (as a Markdown
code block). Prints what it compared; exits 1 naming the first mismatches.

usage: tb_check.py METRICS_JSONL EVENTS_DIR [--spec FILE]
"""
import json
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def flatten(record, prefix=""):
    for key, value in record.items():
        tag = prefix + "/" + key if prefix else key
        if isinstance(value, dict):
            yield from flatten(value, tag)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and tag != "step":
            yield tag, value


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main(argv):
    metrics, events_dir = argv[1], argv[2]
    spec = argv[argv.index("--spec") + 1] if "--spec" in argv else None
    want = {}  # tag -> {step: value}; a step logged again (a restart) keeps its last value
    steps = set()
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            steps.add(record["step"])
            for tag, value in flatten(record):
                want.setdefault(tag, {})[record["step"]] = value
    acc = ea.EventAccumulator(events_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    problems = []
    got_tags = set(tags["scalars"])
    for tag in sorted(got_tags - set(want)):
        problems.append(f"scalar {tag} is not in metrics.jsonl")
    count, worst_rel = 0, 0.0
    for tag in sorted(want):
        if tag not in got_tags:
            problems.append(f"scalar {tag} missing (metrics.jsonl has it at {len(want[tag])} steps)")
            continue
        events = acc.Scalars(tag)
        got = {e.step: e.value for e in events}
        if len(got) != len(events):  # a step twice: a restart's redone steps were not superseded
            twice = sorted({e.step for e in events if [x.step for x in events].count(e.step) > 1})
            problems.append(f"scalar {tag}: steps {twice} read more than once")
        if set(got) != set(want[tag]):
            problems.append(f"scalar {tag}: steps {sorted(got)} != metrics.jsonl's {sorted(want[tag])}")
        for step, value in want[tag].items():
            if step not in got:
                continue
            count += 1
            if got[step] != as_float32(value):
                problems.append(f"scalar {tag} at step {step}: {got[step]!r} != float32({value!r})")
            if value != 0:
                worst_rel = max(worst_rel, abs(got[step] - value) / abs(value))
    print(f"tb_check: {count} scalars of {len(want)} tags at {len(steps)} steps read by EventAccumulator; "
          f"max relative difference from metrics.jsonl {worst_rel:.3g} (float32 rounding bound {2**-24:.3g})")
    if spec is not None:
        if "spec" not in tags["tensors"]:
            problems.append("no text summary 'spec'")
        else:
            plugin = acc.SummaryMetadata("spec").plugin_data.plugin_name
            texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("spec")]
            with open(spec) as f:
                expected = "".join("    " + l for l in f.read().splitlines(True))
            print(f"tb_check: text 'spec' (plugin {plugin}) at steps {[s for s, _ in texts]}, "
                  f"{len(texts[0][1])} chars; {spec}: {len(expected)} chars as a code block")
            if plugin != "text":
                problems.append(f"'spec' has plugin {plugin!r}, not 'text'")
            if texts[0][0] != 0 or texts[0][1].rstrip() != expected.rstrip():
                problems.append("the text 'spec' at step 0 is not the spec file's text")
    for p in problems[:10]:
        print("tb_check: MISMATCH " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
