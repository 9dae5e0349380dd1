"""The adapter's entry points, and the modes it must refuse by name instead of serving wrongly."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from sglang_prefill_ext import adapters  # noqa: E402
from sglang_prefill_ext.adapters import make_sglang_cache  # noqa: E402
from sglang_prefill_ext.config import PrefillExtConfig  # noqa: E402

PrefillExtRadixCache = adapters.current("radix_cache").PrefillExtRadixCache
build_tree_cache = adapters.current("tree_cache").build_tree_cache


def cache_params(**overrides: object) -> CacheInitParams:
    base = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None, page_size=1
    )
    return dataclasses.replace(base, **overrides)


def test_make_sglang_cache_is_a_simulated_adapter() -> None:
    cache = make_sglang_cache(page_size=16, enable_kv_cache_events=True)
    assert isinstance(cache, PrefillExtRadixCache)
    assert (cache.page_size, cache.total_size()) == (16, 0)
    # Events are on: the construction's reset is reported, as stock reports it.
    assert [type(event).__name__ for event in cache.take_events()] == ["AllBlocksCleared"]


def test_eagle_bigram_keys_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="EAGLE"):
        PrefillExtRadixCache(cache_params(is_eagle=True))


def test_session_radix_cache_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="session radix cache"):
        PrefillExtRadixCache(cache_params(enable_session_radix_cache=True))


def test_config_eviction_overrides_sglang_policy() -> None:
    cache = PrefillExtRadixCache(cache_params(eviction_policy="lfu"), PrefillExtConfig(eviction="cost"))
    assert cache.tree.eviction.name == "cost"
    assert PrefillExtRadixCache(cache_params(eviction_policy="lfu")).tree.eviction.name == "lfu"


@pytest.mark.parametrize(
    ("sglang_policy", "option", "tree"),
    [("lru", None, "reuse"), ("lfu", None, "lfu"), ("lru", "lru", "lru"), ("fifo", "cost", "cost")],
)
def test_default_eviction_is_reuse_unless_a_policy_is_asked_for(
    sglang_policy: str, option: str | None, tree: str
) -> None:
    """Unset --prefill-ext-eviction: `reuse` while --radix-eviction-policy is its default (lru), else that policy."""
    cache = PrefillExtRadixCache(
        cache_params(eviction_policy=sglang_policy), PrefillExtConfig(eviction=option)
    )
    assert cache.tree.eviction.name == tree


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"is_hybrid_swa": True}, "hybrid SWA"),
        ({"is_hybrid_ssm": True}, "SSM"),
        ({"enable_hierarchical_cache": True}, "HiCache"),
        ({"disable_radix_cache": True}, "--disable-radix-cache"),
    ],
)
def test_build_refuses_other_cache_kinds(sglang_harness: ModuleType, overrides: dict, named: str) -> None:
    context = sglang_harness.tree_cache_context(sglang_harness.parse_server_args(), **overrides)
    with pytest.raises(ValueError, match=named):
        build_tree_cache(context)


def test_build_reads_prefill_ext_options(sglang_harness: ModuleType) -> None:
    server_args = sglang_harness.parse_server_args("--enable-prefill-ext", "--prefill-ext-eviction", "fifo")
    assert build_tree_cache(sglang_harness.tree_cache_context(server_args)).tree.eviction.name == "fifo"


def test_build_refuses_lmcache(sglang_harness: ModuleType) -> None:
    # Without --enable-prefill-ext, which server-args validation refuses beside --enable-lmcache: the
    # builder must refuse it on its own.
    server_args = sglang_harness.parse_server_args("--enable-lmcache")
    with pytest.raises(ValueError, match="--enable-lmcache"):
        build_tree_cache(sglang_harness.tree_cache_context(server_args))
