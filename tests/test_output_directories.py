"""Output directories: created 0700 whatever the umask (or directory_mode), symlinked and foreign-owned
directories refused with one line unless allowed; the file sink and the Kafka spool alike."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from cuptistream.config import convert
from cuptistream.errors import ConfigError, SinkUnavailableError
from cuptistream.sinks.file import FileSink, FileSinkConfig
from cuptistream.sinks.kafka.spool import Spool


def open_sink(**settings: object) -> FileSink:
    sink = FileSink(convert({"type": "file", **settings}, FileSinkConfig, "sinks[0]"))

    async def main() -> None:
        await sink.open()
        await sink.close()

    trio.run(main)
    return sink


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)  # the worst case: everything the process creates is world-writable
    try:
        yield
    finally:
        os.umask(old)


def test_created_directories_are_0700_whatever_the_umask(tmp_path: Path, open_umask: None) -> None:
    open_sink(directory=str(tmp_path / "out"))
    assert mode(tmp_path / "out") == 0o700
    open_sink(directory=str(tmp_path / "shared"), directory_mode="0750")
    assert mode(tmp_path / "shared") == 0o750
    spool = Spool(str(tmp_path / "spool"), 1 << 20, 1 << 16, "never", "kafka")
    spool.open()
    spool.close()
    assert mode(tmp_path / "spool") == 0o700


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir(mode=0o755)
    os.chmod(tmp_path / "out", 0o755)
    open_sink(directory=str(tmp_path / "out"))
    assert mode(tmp_path / "out") == 0o755


def test_symlinked_directory_is_refused_unless_allowed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(SinkUnavailableError) as caught:
        open_sink(directory=str(tmp_path / "link"))
    message = str(caught.value)
    assert message.startswith("sinks[file].directory: ") and "\n" not in message
    assert "is a symbolic link" in message and "allow_symlink: true" in message
    open_sink(directory=str(tmp_path / "link"), allow_symlink=True)
    with pytest.raises(SinkUnavailableError, match=r"spool_directory: .* is a symbolic link"):
        Spool(str(tmp_path / "link"), 1 << 20, 1 << 16, "never", "kafka").open()


def test_foreign_owned_directory_is_refused_unless_allowed(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        foreign = tmp_path / "theirs"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)  # nobody
    else:
        foreign = Path("/")  # root's, and not ours
    with pytest.raises(SinkUnavailableError) as caught:
        open_sink(directory=str(foreign))
    message = str(caught.value)
    assert "belongs to another user" in message and "allow_foreign_owner: true" in message
    assert "\n" not in message
    if os.geteuid() == 0:  # root can write there; another user could not write to /
        open_sink(directory=str(foreign), allow_foreign_owner=True)


def test_a_file_where_the_directory_should_be_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(SinkUnavailableError, match=r"out is not a directory; choose a directory$"):
        open_sink(directory=str(tmp_path / "out"))


@pytest.mark.parametrize("value", ["0600", 0o1777, "rwx", -1, True])
def test_directory_mode_must_keep_the_owner_rwx(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        convert({"type": "file", "directory_mode": value}, FileSinkConfig, "sinks[0]")
    assert str(caught.value).startswith("sinks[0]") and "directory_mode" in str(caught.value)
