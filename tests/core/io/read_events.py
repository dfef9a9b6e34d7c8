"""Reads TensorBoard event files the way TensorBoard does and prints what it finds as JSON.

    read_events.py DIR                   everything in the event files under DIR
    read_events.py --reference-histogram VALUES_FILE
                                         PyTorch's histogram (bins="tensorflow") of the whitespace-
                                         separated numbers in VALUES_FILE, computed with numpy

Run with the Python of the TensorBoard virtual environment that scripts/setup.sh makes (the
tensorboard package from PyPI). The first form uses TensorBoard's own EventAccumulator (which
reads the records through TensorBoard's TFRecord reader, checking every CRC, and keeps every event
with size guidance 0) and prints

    {"file_version": 2.0,
     "scalars":    {tag: [{"step", "wall_time", "value"}, ...]},
     "histograms": {tag: [{"step", "wall_time", "min", "max", "num", "sum", "sum_squares",
                           "bucket_limit": [...], "bucket": [...]}, ...]},
     "texts":      {tag: [{"step", "wall_time", "plugin", "text"}, ...]}}

with events in file order. JSON has no NaN or infinity: such numbers are written as the strings
"nan", "inf" and "-inf". Used by tests/core/io/summary_writer_test.cc and
tests/examples/tensorboard_example_test.cc.
"""

import json
import math
import sys


def num(x):
    x = float(x)
    return x if math.isfinite(x) else repr(x)


def read_events(path):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    keep_all = {kind: 0 for kind in event_accumulator.DEFAULT_SIZE_GUIDANCE}
    acc = event_accumulator.EventAccumulator(path, size_guidance=keep_all)
    acc.Reload()
    tags = acc.Tags()
    out = {"file_version": acc.file_version, "scalars": {}, "histograms": {}, "texts": {}}
    for tag in tags.get(event_accumulator.SCALARS, []):
        out["scalars"][tag] = [
            {"step": e.step, "wall_time": num(e.wall_time), "value": num(e.value)} for e in acc.Scalars(tag)
        ]
    for tag in tags.get(event_accumulator.HISTOGRAMS, []):
        rows = []
        for e in acc.Histograms(tag):
            h = e.histogram_value
            rows.append({
                "step": e.step,
                "wall_time": num(e.wall_time),
                "min": num(h.min),
                "max": num(h.max),
                "num": num(h.num),
                "sum": num(h.sum),
                "sum_squares": num(h.sum_squares),
                "bucket_limit": [num(x) for x in h.bucket_limit],
                "bucket": [num(x) for x in h.bucket],
            })
        out["histograms"][tag] = rows
    for tag in tags.get(event_accumulator.TENSORS, []):
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        rows = []
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            text = value.item() if value.shape == () else value.reshape(-1)[0]
            rows.append({
                "step": e.step,
                "wall_time": num(e.wall_time),
                "plugin": plugin,
                "text": text.decode("utf-8") if isinstance(text, bytes) else str(text),
            })
        out["texts"][tag] = rows
    return out


def reference_histogram(values_file):
    """torch.utils.tensorboard's make_histogram with its default ("tensorflow") bins."""
    import numpy as np

    with open(values_file) as f:
        values = np.array([float(x) for x in f.read().split()], dtype=np.float64)
    v, pos = 1e-12, []
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    edges = [-x for x in reversed(pos)] + [0] + pos
    counts, limits = np.histogram(values, bins=edges)
    nonzero = np.cumsum(np.greater(counts, 0))
    start, end = np.searchsorted(nonzero, [0, nonzero[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    counts = counts[start - 1:end] if start > 0 else np.concatenate([[0], counts[:end]])
    limits = limits[start:end + 1]
    return {
        "min": num(values.min()),
        "max": num(values.max()),
        "num": len(values),
        "sum": num(values.sum()),
        "sum_squares": num(values.dot(values)),
        "bucket_limit": [num(x) for x in limits],
        "bucket": [num(x) for x in counts],
    }


def main(argv):
    if len(argv) == 3 and argv[1] == "--reference-histogram":
        result = reference_histogram(argv[2])
    elif len(argv) == 2:
        result = read_events(argv[1])
    else:
        sys.stderr.write(__doc__)
        return 2
    json.dump(result, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
