"""Where the collector's time goes: py-spy raw stacks (``bench/fanin.py --profile``) bucketed by stage.

    python bench/profile_stages.py bench/results/DIR/n4-run0/profile.txt [more profile.txt ...]

Each sample goes to the stage of its deepest frame that a rule names (rules below, leaf first), so
``zstd`` inside the file sink's write counts as zstd, not as the write. Prints one row per stage:
its share of all samples (``--profile``: on-CPU samples, every thread of the collector and its
decode workers; ``--profile-gil``: the thread holding the GIL) and the process and thread it ran on.
"""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# (stage, pattern over a frame's function name or file): the first rule matching a frame, scanning from the leaf, wins.
RULES: list[tuple[str, str]] = [
    ("zstd compress", r"^(FrameEncoder\.frame|ZstdCompressor)"),
    ("file write (os.write, fsync, rotate)", r"^(SegmentWriter\.|FileSink\._write)"),
    ("decode: walk (record offsets, kinds)", r"^(walk|_walk_each)$"),
    ("decode: gather (numpy fields)", r"^(gather|RecordLayouts\.dtype|choose_dtype)$"),
    ("pack: columnar msgpack (hot kinds)", r"^(Packer\.|PackedConverters\.|group_by)"),
    ("convert: per-record Structs + msgpack", r"^(StructConverters\.|encode_chunk)"),
    ("decode: other (Decoder._records)", r"^Decoder\.(_records|decode_packed)$"),
    (
        "intake hand-off + trio wake-up",
        r"^(Intake\.emit_chunk|_ProducerEmitter\.emit_chunk|TrioToken\.run_sync_soon)",
    ),
    ("slot drain (headers, views, release)", r"^ProbeConnection\._drain$"),
    ("socket messages", r"^(receive|ProbeConnection\.(run|_handle))$"),
    ("batch encode (lane)", r"^(encode_batch|SinkLane\._take_batch|SinkLane\._deliver)$"),
    ("distributor (intake -> lanes)", r"^(Pipeline\._distribute|SinkLane\.offer|Intake\.take)"),
    (
        "trio scheduler / thread hand-off",
        r"^(run|unrolled_run|EpollIOManager|WakeupSocketpair|to_thread_run_sync|WorkerThread)",
    ),
    ("memory sampling", r"^MemoryWatch\."),
    ("statistics", r"^cuptistream/statistics/"),
    ("worker wire: send reply", r"^(send_reply|Session\._reply|Session\.serve)$"),
    ("worker wire: receive", r"^(receive_request|_receive)$"),
]
_FRAME = re.compile(r"^(\S+) \(([^:)]*)")  # "name (file:line)": a rule matches the name or the file


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        match = _FRAME.match(frame)
        if match is None:
            continue
        name, file = match.groups()
        for stage, pattern in RULES:
            if re.search(pattern, name) or re.search(pattern, file):
                return stage
    return "other"


# py-spy --subprocesses puts each process of the chain first: `process PID:"cmdline";`
# A program's command line may hold newlines (``python -c SOURCE``), so samples are split where a
# line starts a stack, not at every newline.
_PROCESS = re.compile(r'process \d+:"(.*?)";(?=process \d+:"|thread \()', re.DOTALL)
WORKER = "cuptistream.collector.workers"  # a decode worker's module, in its command line
_SAMPLE_START = re.compile(r'\n(?=process \d+:"|thread \()')


def thread_of(head: str) -> str:
    name = head.split(": ", 1)[1] if ": " in head else head
    return re.sub(r" \d+$", "", name)  # "Trio thread 3" -> "Trio thread"


def split_process(line: str) -> tuple[str | None, str]:
    """The sample's process (collector, worker, or None for a program) and the rest of its line."""
    chain = []
    while (match := _PROCESS.match(line)) is not None:
        chain.append(match.group(1))
        line = line[match.end() :]
    if not chain:  # recorded without --subprocesses: the collector alone
        return "collector", line
    if WORKER in chain[-1]:
        return "worker", line
    return ("collector", line) if len(chain) == 1 else (None, line)


def samples(text: str) -> Iterator[tuple[str, str]]:
    """(process, stack and count) per sample of the collector or a decode worker; the programs
    under the collector are left out."""
    for sample in _SAMPLE_START.split(text.strip()):
        process, rest = split_process(sample)
        if process is not None:
            yield process, rest


def keep_collector(path: Path) -> None:
    """Rewrite a ``--subprocesses`` profile with the collector's and its workers' samples only,
    one line each (the programs' samples made a 16-program profile 18 MB)."""
    lines = [
        rest if process == "collector" else f'process 0:"{WORKER}";{rest}'
        for process, rest in samples(path.read_text())
    ]
    path.write_text("".join(line + "\n" for line in lines))


def stages(path: Path) -> tuple[collections.Counter[tuple[str, str]], int]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for process, line in samples(path.read_text()):
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        counts[stage_of(frames[1:]), f"{process}: {thread_of(frames[0])}"] += int(n)
    return counts, sum(counts.values())


def main(paths: list[str]) -> int:
    for path in paths:
        counts, total = stages(Path(path))
        print(f"\n{path}: {total} samples")
        print("| stage | % of samples | thread |\n|---|---|---|")
        for (stage, thread), n in counts.most_common():
            if 100 * n / total >= 0.5:
                print(f"| {stage} | {100 * n / total:.1f} | {thread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
