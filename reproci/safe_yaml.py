"""The one reader of the YAML files reproci reads (reproci.yaml, image manifests, goldens), bounded:
a file over its size limit is refused before it is read whole, aliases may repeat a bounded number
of values in all and never a value inside itself (a "billion laughs" bomb is ten lines), and a key
that a mapping holds twice is an error where plain YAML keeps the last one silently.

Each refusal is a ``yaml.MarkedYAMLError`` with the line it is at, so that every reader's
existing handler turns it into its one-line error, as it does a syntax error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MiB = 1024 * 1024
CONFIG_LIMIT = MiB  # reproci.yaml, written by hand: a few hundred bytes
MANIFEST_LIMIT = MiB  # an image manifest: a few kilobytes
GOLDEN_LIMIT = 16 * MiB  # a golden's YAML: each model's identity and losses (its arrays are in the sidecar)
ALIASED_VALUES = 10_000  # values that aliases may repeat in one file, all together: anchors for shared settings


class Refused(yaml.MarkedYAMLError):
    """A file this reader will not read: too large, an alias bomb, a key given twice."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the safe loader's own error says so
                break
            if first is not key_node:
                raise Refused(None, None, f"the key {key!r} is given twice (first at line {first.start_mark.line + 1}); "
                              "keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_aliases(root: yaml.Node) -> None:
    """Refuse a document whose aliases repeat more than ALIASED_VALUES values, or a value inside itself.

    Counted on the composed nodes, each once (an alias is the same node object again): milliseconds
    for a bomb that would expand to billions."""
    sizes: dict[int, int] = {}  # id(node) -> values it holds, aliases expanded
    composed = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()  # the nodes whose values are being counted: the current node's own ancestors
    while stack:
        node, done = stack.pop()
        if done:
            children = _children(node)
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), 1 << 62)
            open_.discard(id(node))
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_:
            raise Refused(None, None, "an alias repeats a value inside itself; write the value out",
                          node.start_mark)
        open_.add(id(node))
        composed += 1
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    if sizes[id(root)] - composed > ALIASED_VALUES:
        raise Refused(None, None, f"its aliases repeat more than {ALIASED_VALUES:,} values; write the values out",
                      None)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load(path: Path, *, limit: int) -> Any:
    """The YAML document in ``path`` (None where it is empty), read only when it holds at most
    ``limit`` bytes. Raises OSError, UnicodeDecodeError and yaml.YAMLError (``Refused`` among them)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(None, None, f"the file is over {limit / MiB:g} MiB, more than such a file may hold; "
                      "is it the right file?", None)
    loader = _Loader(data.decode("utf-8"))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
