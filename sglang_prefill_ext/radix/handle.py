"""Match handles: what a waiting request keeps so its next match only extends the last one."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from sglang_prefill_ext.radix.node import Node


@dataclasses.dataclass
class MatchHandle:
    """The longest cached prefix of a key: `length` tokens ending exactly at `node`, slots `values`.

    Valid while `epoch` equals the tree's (bumped by reset) and `node` is alive (eviction kills
    leaves first, so a live node has a live, unchanged path). A split keeps the lower half's identity,
    so handles survive splits.
    """

    node: Node
    length: int
    values: Any
    namespace: Hashable
    epoch: int
