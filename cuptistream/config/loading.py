"""The config's YAML reader: one document, safely, with limits that keep a hostile or broken file
from costing time or memory (alias bombs, deep nesting, duplicate keys, control characters).

Every failure is a one-line ``ConfigError`` naming the file; ``cuptistream.config.load`` builds the
config from what this returns.
"""

from __future__ import annotations

from typing import Any

import yaml

from cuptistream.errors import ConfigError

MAX_YAML_VALUES = 100_000  # after expanding aliases: a config is tiny, an alias bomb is not
MAX_CONFIG_BYTES = 1024 * 1024


MAX_FLOW_DEPTH = 64  # [ and { nesting: a config needs 3 or 4 levels


class _Loader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys (the last one would silently win) and deep flow nesting
    (PyYAML's scanner costs quadratic time in it: 1000 ``[`` took over a second)."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level >= MAX_FLOW_DEPTH:
            problem = f"nested too deeply to be a config (over {MAX_FLOW_DEPTH} levels)"
            raise yaml.scanner.ScannerError(None, None, problem, self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # unhashable keys are refused by validation with their path
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (keep one)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values ``node`` stands for once its aliases are expanded (shared nodes counted once
    per use), without expanding them."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a cycle counts once; a recursive alias is refused by the constructor anyway
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = size = min(size, MAX_YAML_VALUES + 1)
    return size


def parse_yaml(text: str, origin: str) -> Any:
    """Parse one YAML document. Raises ``ConfigError`` (one line) on bad YAML, duplicate keys, deep
    nesting or a document that expands to more than ``MAX_YAML_VALUES`` values."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{origin}: {len(text)} characters is not a config (at most 1MiB)")
    try:
        loader = _Loader(text)  # its reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as error:
        code = ord(error.character) if isinstance(error.character, str) else error.character
        raise ConfigError(
            f"{origin}: character #x{code:04x} at position {error.position} is not allowed in YAML; remove it"
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_YAML_VALUES:
            limit = f"more than {MAX_YAML_VALUES} values"
            raise ConfigError(f"{origin}: expands to {limit} (YAML aliases); write the values out")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ConfigError(f"{origin}: {problem}{where}".replace("\n", " ")) from None
    except RecursionError:
        raise ConfigError(f"{origin}: nested too deeply to be a config") from None
    except (ValueError, OverflowError, LookupError, TypeError, AttributeError) as error:  # a tagged value
        reason = str(error).split(";")[0]
        raise ConfigError(
            f"{origin}: a value YAML cannot read ({reason}); quote it to keep it as text"
        ) from None
    finally:
        loader.dispose()
