"""The probe runtime: per interpreter ABI, a folder with cuptistream and the packages it imports, so
that a job's environment needs nothing of ours but the hook.

``<root>/hook/`` holds the hook's standard-library modules (any Python); ``<root>/python/<SOABI>/``
holds the probe's packages for one ABI. For the ABI of the interpreter running ``node install``,
the packages are taken from its own environment (hard links where possible: no download, the
versions this install runs with); for another ABI, pip installs cuptistream's requirements for that
interpreter (``pip --python``), from the configured index or ``--wheelhouse``. cuptistream itself is
pure Python and always copied. ``<root>/hooks.txt`` lists which environment uses which runtime, so
the last ``uninstall`` that uses a runtime removes it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from cuptistream.errors import UserError
from cuptistream.node.interpreter import Interpreter

DEFAULT_ROOT = Path("/opt/cuptistream/node")
BOOT_DIR = Path(__file__).resolve().parent.parent / "probe" / "boot"
HOOK_MODULES = ("_cuptistream_node.py", "_cuptistream_trigger.py", "_cuptistream_import_hooks.py")
_PACKAGE = "cuptistream"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def hook_dir(root: Path) -> Path:
    return root / "hook"


def runtime_dir(root: Path, interpreter: Interpreter) -> Path:
    return root / "python" / interpreter.soabi


def prepare(root: Path, interpreter: Interpreter, here: Interpreter, wheelhouse: Path | None) -> Path:
    """Make sure ``root`` has the hook modules and a runtime for ``interpreter``; returns the
    runtime folder. An existing runtime is rebuilt (an upgrade of the node install)."""
    target = runtime_dir(root, interpreter)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        _copy_hook_modules(hook_dir(root))
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if wheelhouse is None and interpreter.soabi == here.soabi and interpreter.platform == here.platform:
            for distribution in _closure(_PACKAGE):
                if _key(distribution.metadata["Name"]) != _PACKAGE:
                    _link_distribution(distribution, staging)
        else:
            _pip_install(interpreter, staging, wheelhouse)
        _copy_cuptistream(staging)
        _compile(interpreter, staging / _PACKAGE, hook_dir(root))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        where = error.filename or root
        raise UserError(f"node install: cannot write {where}: {error.strerror}; run as a user who may "
                        f"write {root}, or pass --root DIR") from None  # fmt: skip
    return target


def _copy_hook_modules(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in HOOK_MODULES:
        shutil.copyfile(BOOT_DIR / name, folder / name)


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(distribution: importlib.metadata.Distribution) -> list[str]:
    """Its base requirements (extras left out), markers and all."""
    return [r for r in distribution.requires or [] if "extra ==" not in r.replace('"', "'")]


def _closure(name: str) -> Iterator[importlib.metadata.Distribution]:
    """``name`` and every installed distribution it requires, each once. A requirement that is not
    installed is one whose marker excludes it here (this interpreter has the target's ABI); one that
    is installed though its marker excludes it only adds a few unused files."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        key = _key(todo.pop())
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = importlib.metadata.distribution(key)
        except importlib.metadata.PackageNotFoundError:
            continue
        yield distribution
        for text in _requirements(distribution):
            if found := _NAME.match(text):
                todo.append(found[0])


def _link_distribution(distribution: importlib.metadata.Distribution, staging: Path) -> None:
    """The files its RECORD lists under site-packages (scripts outside it are left out)."""
    for file in distribution.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        source = Path(str(distribution.locate_file(file)))
        if not source.is_file():
            continue
        destination = staging / file
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, destination)
        except OSError:  # another file system, or links refused
            shutil.copy2(source, destination)


def _copy_cuptistream(staging: Path) -> None:
    """The package as this process imports it (an editable checkout maps ``cuptistream.sources``
    and ``cuptistream.sinks`` from other folders), and its metadata (entry points: the sources and
    sinks are found through them)."""
    package = staging / _PACKAGE
    shutil.copytree(_location(_PACKAGE), package, ignore=_IGNORE)
    for sub in ("sources", "sinks"):
        if not (package / sub).exists():
            shutil.copytree(_location(f"{_PACKAGE}.{sub}"), package / sub, ignore=_IGNORE)
    distribution = importlib.metadata.distribution(_PACKAGE)
    info = staging / f"{_PACKAGE}-{distribution.version}.dist-info"
    info.mkdir()
    for name in ("METADATA", "entry_points.txt"):
        text = distribution.read_text(name)
        if text is not None:
            (info / name).write_text(text, encoding="utf-8")


def _location(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"node install: cannot find the {module} package; reinstall cuptistream")
    return Path(next(iter(spec.submodule_search_locations)))


def _pip_install(interpreter: Interpreter, staging: Path, wheelhouse: Path | None) -> None:
    requirements = _requirements(importlib.metadata.distribution(_PACKAGE))
    command = [
        sys.executable, "-m", "pip", "--python", interpreter.executable, "install", "--quiet",
        "--disable-pip-version-check", "--no-warn-script-location", "--only-binary=:all:",
        "--target", str(staging), *requirements,
    ]  # fmt: skip
    if wheelhouse is not None:
        command[6:6] = ["--no-index", "--find-links", str(wheelhouse)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
        source = f"the wheelhouse {wheelhouse}" if wheelhouse else "the package index"
        raise UserError(f"node install: pip could not install the probe's packages for "
                        f"{interpreter.name} from {source}: {lines[-1].strip()}; pass --wheelhouse DIR "
                        f"with wheels for it")  # fmt: skip
    shutil.rmtree(staging / "bin", ignore_errors=True)


def _compile(interpreter: Interpreter, *folders: Path) -> None:
    """Byte-compile for the target, so that job processes (often not allowed to write here) do not
    compile the probe on every start."""
    subprocess.run(
        [interpreter.executable, "-I", "-m", "compileall", "-q", "-j", "0", *map(str, folders)],
        capture_output=True, check=False,
    )  # fmt: skip


# --- which environment uses which runtime --------------------------------------------------------


def _users_file(root: Path) -> Path:
    return root / "hooks.txt"


def users(root: Path) -> dict[str, str]:
    """site-packages folder -> the runtime its hook uses."""
    try:
        lines = _users_file(root).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("\t", 1) for line in lines if "\t" in line)


def _write_users(root: Path, table: dict[str, str]) -> None:
    if table:
        text = "".join(f"{site}\t{runtime}\n" for site, runtime in sorted(table.items()))
        _users_file(root).write_text(text, encoding="utf-8")
    else:
        _users_file(root).unlink(missing_ok=True)


def add_user(root: Path, site_packages: Path, runtime: Path) -> None:
    table = users(root)
    table[str(site_packages)] = str(runtime)
    _write_users(root, table)


def release(root: Path, site_packages: Path, runtime: str) -> list[str]:
    """Forget ``site_packages``; remove the runtime (and the hook modules) nobody uses any more.
    Returns what was removed."""
    table = users(root)
    table.pop(str(site_packages), None)
    removed = []
    try:
        _write_users(root, table)
        if runtime not in table.values() and Path(runtime).is_dir() and Path(runtime).parent.parent == root:
            shutil.rmtree(runtime)
            removed.append(runtime)
        if not table and hook_dir(root).is_dir():
            shutil.rmtree(hook_dir(root))
            removed.append(str(hook_dir(root)))
            for empty in (root / "python", root):
                if empty.is_dir() and not any(empty.iterdir()):
                    empty.rmdir()
    except OSError as error:
        raise UserError(f"node uninstall: cannot update {root}: {error.strerror}; run as a user who may "
                        f"write it") from None  # fmt: skip
    return removed
