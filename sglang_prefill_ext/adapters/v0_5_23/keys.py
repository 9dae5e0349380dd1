"""How SGLang 0.5.23's radix keys map to the core's namespaces (no SGLang import: the scheduler
adapter, loaded while SGLang's modules are still loading, uses it too)."""

from __future__ import annotations

from collections.abc import Hashable


def namespace(extra_key: str | None, cache_salt: str | None) -> Hashable:
    """The core's namespace for a 0.5.23 key: `extra_key`, paired with `cache_salt` when salted."""
    return extra_key if cache_salt is None else (extra_key, cache_salt)


def key_parts(space: Hashable) -> tuple[str | None, str | None]:
    """`(extra_key, cache_salt)` of a namespace made by `namespace`."""
    return space if isinstance(space, tuple) else (space, None)  # type: ignore[return-value]
