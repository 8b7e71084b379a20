"""The start hook: one ``.pth`` file in an environment's site-packages.

Python's ``site`` module runs a ``.pth`` line that starts with ``import`` in every process (unless
``-S``). Ours costs two environment look-ups and one ``stat`` when no node collector is configured,
and imports nothing; ``sitecustomize`` modules, the environment's or anyone's, are left alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cuptistream.errors import UserError
from cuptistream.probe.boot._cuptistream_node import DEFAULT_NODE_CONFIG, ENV_NODE_CONFIG

HOOK_FILE = "cuptistream-node.pth"
MARK = "# cuptistream node hook: `cuptistream node uninstall` removes this file"

# Under ``cuptistream run`` (its variable set) the run's own boot folder arms the probe instead. The
# ``sys.modules`` test: ``site`` may read the file twice (Debian's venvs have lib64 -> lib).
_TEMPLATE = (
    "import os, sys; p = os.environ.get({env!r}, {default!r}); "
    "p and not os.environ.get('CUPTISTREAM_COLLECTOR') and os.path.exists(p) and "
    "'_cuptistream_node' not in sys.modules and "
    "(sys.path.append({hook_dir!r}) or __import__('_cuptistream_node').arm(p, {runtime!r}))  {mark}\n"
)
_PATHS = re.compile(r"sys\.path\.append\('(?P<hook_dir>[^']*)'\).*\.arm\(p, '(?P<runtime>[^']*)'\)")


@dataclass(frozen=True)
class Hook:
    path: Path  # the .pth file
    hook_dir: str  # where ``_cuptistream_node`` is
    runtime: str  # the probe runtime for this environment's interpreter


def hook_text(hook_dir: Path, runtime: Path) -> str:
    for folder in (hook_dir, runtime):
        if "'" in str(folder) or "\\" in str(folder) or "\n" in str(folder):
            raise UserError(f"node install: the path {str(folder)!r} has a quote, backslash or line break; "
                            f"pass --root with a plain path")  # fmt: skip
    return _TEMPLATE.format(
        env=ENV_NODE_CONFIG, default=DEFAULT_NODE_CONFIG, hook_dir=str(hook_dir), runtime=str(runtime),
        mark=MARK,
    )  # fmt: skip


def read(site_packages: Path) -> Hook | None:
    """The hook installed in ``site_packages``, or None. A file of that name that is not ours
    raises ``UserError``: it is never overwritten or removed."""
    path = site_packages / HOOK_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}; check its permissions") from None
    found = _PATHS.search(text)
    if MARK not in text or found is None:
        raise UserError(f"{path} is not a cuptistream node hook; move it away, then run the command again")
    return Hook(path, found["hook_dir"], found["runtime"])


def write(site_packages: Path, text: str) -> Path:
    """Write the hook: a temporary name, then a rename, so a process starting meanwhile sees all
    of it or none."""
    path = site_packages / HOOK_FILE
    temporary = site_packages / f".{HOOK_FILE}.{os.getpid()}.tmp"
    try:
        temporary.write_text(text, encoding="utf-8")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise UserError(f"node install: cannot write {path}: {error.strerror}; run as a user who may "
                        f"write {site_packages} (the environment's owner, or root)") from None  # fmt: skip
    return path


def remove(hook: Hook) -> None:
    try:
        hook.path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UserError(f"node uninstall: cannot remove {hook.path}: {error.strerror}; run as a user who "
                        f"may write {hook.path.parent}") from None  # fmt: skip
