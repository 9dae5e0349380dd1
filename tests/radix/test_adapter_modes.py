"""The adapter's entry points, and the modes it must refuse by name instead of serving wrongly."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("sglang.srt.mem_cache.radix_cache")

from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.registry import TreeCacheBuildContext  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from sglang_prefill_ext.adapters.v0_5_17.radix_cache import PrefillExtRadixCache  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.tree_cache import build_tree_cache  # noqa: E402
from sglang_prefill_ext.config import PrefillExtConfig  # noqa: E402
from sglang_prefill_ext.radix import make_sglang_cache  # noqa: E402


def cache_params(**overrides: object) -> CacheInitParams:
    base = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None, page_size=1
    )
    return dataclasses.replace(base, **overrides)


def build_context(**overrides: object) -> TreeCacheBuildContext:
    # Unvalidated ServerArgs: its field defaults, without __post_init__'s model loading.
    server_args = ServerArgs.__new__(ServerArgs)
    fields = {
        "server_args": server_args,
        "params": cache_params(),
        "is_hybrid_swa": False,
        "is_hybrid_ssm": False,
        "enable_hierarchical_cache": False,
        "disable_radix_cache": False,
        "effective_chunked_prefill_size": 8192,
        "tp_worker": None,
        "model_config": None,
        "tp_size": 1,
        "tp_rank": 0,
        "tp_group": None,
    }
    fields.update(overrides)
    return TreeCacheBuildContext(**fields)


def test_make_sglang_cache_is_a_simulated_adapter() -> None:
    cache = make_sglang_cache(page_size=16, enable_kv_cache_events=True)
    assert isinstance(cache, PrefillExtRadixCache)
    assert (cache.page_size, cache.enable_kv_cache_events, cache.total_size()) == (16, True, 0)


def test_eagle_bigram_keys_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="EAGLE"):
        PrefillExtRadixCache(cache_params(is_eagle=True))


def test_session_radix_cache_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="session radix cache"):
        PrefillExtRadixCache(cache_params(enable_session_radix_cache=True))


def test_config_eviction_overrides_sglang_policy() -> None:
    cache = PrefillExtRadixCache(cache_params(eviction_policy="lfu"), PrefillExtConfig(eviction="cost"))
    assert cache.tree.eviction == "cost"
    assert PrefillExtRadixCache(cache_params(eviction_policy="lfu")).tree.eviction == "lfu"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"is_hybrid_swa": True}, "hybrid SWA"),
        ({"is_hybrid_ssm": True}, "SSM"),
        ({"enable_hierarchical_cache": True}, "HiCache"),
        ({"disable_radix_cache": True}, "--disable-radix-cache"),
    ],
)
def test_build_refuses_other_cache_kinds(overrides: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build_tree_cache(build_context(**overrides))


def test_build_reads_prefill_ext_options() -> None:
    context = build_context()
    context.server_args.prefill_ext_options = {"eviction": "fifo"}
    assert build_tree_cache(context).tree.eviction == "fifo"
    context.server_args.enable_lmcache = True
    with pytest.raises(ValueError, match="--enable-lmcache"):
        build_tree_cache(context)
