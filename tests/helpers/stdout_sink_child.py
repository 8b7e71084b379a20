"""Child process for the stdout sink tests: drives a real StdoutSink with trio.

``python stdout_sink_child.py N`` writes batches 0..N-1 and exits. With ``N = -1`` it writes until
the sink raises DeliveryError (the reader closed the pipe) and prints that error on stderr.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, for helpers.*

from helpers.batchgen import outgoing

from cuptistream.config import convert
from cuptistream.plugin import DeliveryError
from cuptistream.sinks.stdout import StdoutSink, StdoutSinkConfig


async def main(count: int) -> None:
    sink = StdoutSink(convert({"type": "stdout"}, StdoutSinkConfig, "sinks[0]"))
    await sink.open()
    try:
        for seq in itertools.count() if count < 0 else range(count):
            await sink.write(outgoing(seq, 25, kinds=True))
    except DeliveryError as error:
        print(f"DeliveryError: {error}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing left to flush into a closed pipe
    await sink.close()
    print(f"stats {sink.stats()}", file=sys.stderr)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
