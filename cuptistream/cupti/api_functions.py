"""CUDA runtime and driver API functions by name: the one rule that turns the ``runtime_api`` and
``driver_api`` keys of every source (``activity``, ``callbacks``) into CUPTI callback ids (cbids),
and the name each cbid carries in events.

A pattern is an fnmatch glob, case-sensitive (``cudaMemcpy*``, ``cu*Synchronize``); a name without
wildcards is a glob that matches itself (``cudaLaunchKernel``). A function matches when the pattern
matches any of its names:

- CUPTI's enum name (``cudaLaunchKernel_v7000``, ``cuMemcpyHtoD_v2``);
- that name without the version suffix (``cudaLaunchKernel``, ``cuMemcpyHtoD``): the name events
  carry (``api_names``);
- without the per-thread-stream suffix and then the version (``cudaLaunchKernel_ptsz_v7000`` and
  ``cuMemcpyHtoD_v2_ptds`` become ``cudaLaunchKernel`` and ``cuMemcpyHtoD``), so a function selects
  its per-thread-stream twin.

The cbids come from cupti-python's enums, which need no driver or GPU.
"""

from __future__ import annotations

import fnmatch
import re
from functools import cache

_VERSION_SUFFIX = re.compile(r"_v\d+$")
_PER_THREAD_SUFFIXES = ("_ptsz", "_ptds")
_NOT_FUNCTIONS = {"INVALID", "SIZE", "FORCE_INT"}


def function_name(cbid_enum_name: str) -> str:
    """``cudaLaunchKernel_v7000`` → ``cudaLaunchKernel``; ``cuLaunchKernel`` stays as it is."""
    return _VERSION_SUFFIX.sub("", cbid_enum_name)


def _names(enum_name: str) -> tuple[str, ...]:
    """Every name a pattern may match for one cbid (see the module docstring)."""
    name = function_name(enum_name)
    base = name
    for suffix in _PER_THREAD_SUFFIXES:
        base = base.removesuffix(suffix)
    return tuple(dict.fromkeys((enum_name, name, base, function_name(base))))


@cache
def _enum_names(domain: str) -> dict[int, str]:
    from cupti import cupti

    enum = {"runtime": cupti.RuntimeApiTraceCbid, "driver": cupti.DriverApiTraceCbid}[domain]
    return {int(m): m.name for m in enum if m.name not in _NOT_FUNCTIONS}


@cache
def api_names(domain: str) -> dict[int, str]:
    """cbid → function name (version suffix dropped) for ``runtime`` or ``driver``: the name API
    events carry, whichever source recorded them."""
    return {cbid: function_name(name) for cbid, name in _enum_names(domain).items()}


@cache
def _aliases(domain: str) -> dict[int, tuple[str, ...]]:
    return {cbid: _names(name) for cbid, name in _enum_names(domain).items()}


def select_cbids(domain: str, patterns: list[str]) -> list[int]:
    """The cbids, sorted, of the functions that match one of ``patterns``."""
    return sorted(
        cbid
        for cbid, names in _aliases(domain).items()
        if any(fnmatch.fnmatchcase(name, p) for p in patterns for name in names)
    )


def unmatched_patterns(domain: str, patterns: list[str]) -> list[str]:
    """Patterns that match no function: most likely typos."""
    return [p for p in patterns if not select_cbids(domain, [p])]


def check_patterns(domain: str, patterns: list[str]) -> None:
    """Raise ``ValueError`` (a config error, keyed ``<domain>_api``) for the first pattern that
    matches no function."""
    if bad := unmatched_patterns(domain, patterns):
        example = "cudaLaunchKernel" if domain == "runtime" else "cuLaunchKernel"
        raise ValueError(
            f"{domain}_api pattern {bad[0]!r} matches no {domain} API function "
            f"(CUPTI's names, e.g. {example}; globs such as {example[:-6]}* work)"
        )
