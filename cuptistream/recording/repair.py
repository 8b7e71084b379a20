"""``cuptistream repair DIR``: finish the files killed writers left in a recording directory.

- A ``.tmp`` file no live writer holds (writers ``flock`` theirs) is renamed to its final name.
- A torn tail at the end of a finished file (a frame cut short by the kill) is cut off, so the file
  reads clean; every complete frame stays.
- Other damage (a checksum mismatch, garbage, a file that is not ours) is reported and left in
  place: readers skip it, and the bytes stay for whoever investigates.

Exit status 0 when no damage is left, 1 when some is (each reported on its own line).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cuptistream.errors import UserError

if TYPE_CHECKING:  # the CLI imports this module at start-up: keep zstandard out of it
    from cuptistream.recording.framing import Damage


@dataclass
class RepairReport:
    sealed: list[Path] = field(default_factory=list)  # .tmp files (now) renamed to their final names
    left: list[Path] = field(default_factory=list)  # .tmp files held by a live writer (or empty)
    cut: list[Damage] = field(default_factory=list)  # torn tails cut off
    damaged: list[Damage] = field(default_factory=list)  # damage left in place


def repair(directory: str | Path, *, dry_run: bool = False) -> RepairReport:
    """Seal orphaned ``.tmp`` files and cut torn tails in ``directory`` (see the module docstring).
    With ``dry_run`` nothing is changed and the report says what would be done."""
    from cuptistream.recording.reader import Reader, file_format
    from cuptistream.recording.segments import TEMP_SUFFIX, seal_if_orphan

    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"{root}: not a directory; give the directory the file sink wrote")
    report = RepairReport()
    for path in sorted(p for p in root.iterdir() if file_format(p) and p.is_file() and not p.is_symlink()):
        if path.name.endswith(TEMP_SUFFIX):
            final = None if dry_run else seal_if_orphan(path)
            if final is None and (not dry_run or _held(path)):
                report.left.append(path)
                continue
            report.sealed.append(path)
            path = final or path
        reader = Reader([path])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in reader.batches():
                pass
        size = path.stat().st_size
        for damage in reader.damage:
            if damage.torn and damage.offset + damage.length == size:
                if not dry_run:
                    os.truncate(path, damage.offset)
                report.cut.append(damage)
            else:
                report.damaged.append(damage)
    return report


def _held(path: Path) -> bool:
    """Whether a live writer holds ``path`` (or it is empty): what ``seal_if_orphan`` leaves alone."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        return os.fstat(fd).st_size == 0
    finally:
        os.close(fd)


def _cmd_repair(args: argparse.Namespace) -> int:
    report = repair(args.directory, dry_run=args.dry_run)
    would = "would " if args.dry_run else ""
    for path in report.sealed:
        print(f"{would}seal {path.name} (left by a killed writer)")
    for path in report.left:
        print(f"left {path.name}: a live writer holds it, or it is empty")
    for damage in report.cut:
        name, length = Path(damage.path).name, damage.length
        print(f"{would}cut {name}: torn tail of {length} bytes at offset {damage.offset}")
    for damage in report.damaged:
        print(f"cuptistream: {damage.describe()}; left in place, readers skip it", file=sys.stderr)
    changed = len(report.sealed) + len(report.cut)
    print(f"{args.directory}: {would}seal {len(report.sealed)}, {would}cut {len(report.cut)} torn tails, "
          f"{len(report.damaged)} damaged ranges left" if changed or report.damaged else
          f"{args.directory}: nothing to repair")  # fmt: skip
    return 1 if report.damaged else 0


def add_command(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register ``repair`` on the CLI's subcommands; returns its handler by name."""
    parser = commands.add_parser(
        "repair",
        help="seal .tmp files left by killed writers and cut torn tails",
        description="Rename .tmp files no live writer holds to their final names, cut torn tails off "
        "finished files, and report other damage (left in place; readers skip it). Exit 1 if damage is left.",
    )
    parser.add_argument("directory", metavar="DIR", help="a directory the file sink wrote")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    return {"repair": _cmd_repair}
