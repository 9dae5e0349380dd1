"""The patched SGLang's own argument parsing and tree-cache construction, on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from sglang_prefill_ext import adapters
from sglang_prefill_ext.config import OptionError
from sglang_prefill_ext.patching import PatchSet

pytestmark = pytest.mark.usefixtures("patched_sglang")


def test_launch_server_help_lists_the_flags(patched_sglang: PatchSet) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--enable-prefill-ext" in out
    assert "--prefill-ext-eviction" in out
    assert "sglang-prefill-ext" in out


def test_flag_off_is_stock(sglang_harness: ModuleType) -> None:
    args = sglang_harness.parse_server_args()
    assert args.enable_prefill_ext is False
    assert args.prefill_ext_options is None


def test_flags_reach_server_args(sglang_harness: ModuleType) -> None:
    args = sglang_harness.parse_server_args("--enable-prefill-ext", "--prefill-ext-eviction", "cost")
    assert args.enable_prefill_ext is True
    assert args.prefill_ext_options == {"eviction": "cost"}


def test_bad_option_value_is_an_option_error(sglang_harness: ModuleType) -> None:
    with pytest.raises(OptionError, match="--prefill-ext-eviction='random': choose from"):
        sglang_harness.parse_server_args("--enable-prefill-ext", "--prefill-ext-eviction", "random")


def test_options_without_the_enable_flag_refused(sglang_harness: ModuleType) -> None:
    with pytest.raises(ValueError, match="without --enable-prefill-ext"):
        sglang_harness.parse_server_args("--prefill-ext-eviction", "cost")


@pytest.mark.parametrize("field", sorted(adapters.current("hooks").CONFLICTING_FLAGS))
def test_conflicting_cache_flags_refused(sglang_harness: ModuleType, field: str) -> None:
    flag = "--" + field.replace("_", "-")
    argv = [flag, "flexkv"] if field == "radix_cache_backend" else [flag]
    with pytest.raises(ValueError, match=f"cannot be combined with: {re.escape(flag)}"):
        sglang_harness.parse_server_args("--enable-prefill-ext", *argv)


PORTED = adapters.current("hooks").PORTED_OPTIONS


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("sparse", "true"),
        ("sparse_min_len", "4096"),
        ("dedup", "false"),
        ("schedule", "stock"),
        ("log", "x.jsonl"),
        ("tbt_target_ms", "100"),
        ("lone_pass_ms", "150"),
        ("lone_chunk_sync", "false"),
        ("yield_layers", "4"),
        ("blend", "true"),
    ],
)
def test_options_not_ported_to_this_version_refused(
    sglang_harness: ModuleType, option: str, value: str
) -> None:
    if PORTED is None or option in PORTED:
        pytest.skip(f"--prefill-ext-{option} is served by this SGLang version")
    flag = f"--prefill-ext-{option.replace('_', '-')}"
    with pytest.raises(ValueError, match=f"{flag}: not available on SGLang"):
        sglang_harness.parse_server_args(
            "--enable-prefill-ext", flag, value, "--attention-backend", "flashinfer"
        )


def test_blend_is_refused_on_0_5_23_saying_what_is_missing() -> None:
    """0.5.23's hooks (they import no SGLang) refuse --prefill-ext-blend by name, with why."""
    from sglang_prefill_ext.adapters import common

    hooks = adapters.for_version("0.5.23", "hooks")
    args = SimpleNamespace(enable_prefill_ext=True, prefill_ext_options={"blend": True})
    with pytest.raises(OptionError) as refused:
        common.validate_server_args(
            args, hooks.CONFLICTING_FLAGS, hooks.PORTED_OPTIONS, "0.5.23", hooks.UNPORTED_WHY
        )
    assert str(refused.value) == (
        "--prefill-ext-blend: not available on SGLang 0.5.23 yet (its request objects carry no chunk_spans "
        "and its scheduler patch has no chunk-budget hook to run a blend plan's extends)"
    )


@pytest.mark.parametrize(
    ("option", "value", "parsed"),
    [("dedup", "false", False), ("schedule", "lpm-aging", "lpm-aging"), ("max_wait_passes", "4", 4)],
)
def test_prefill_runner_options_served_on_every_version(
    sglang_harness: ModuleType, option: str, value: str, parsed: object
) -> None:
    flag = f"--prefill-ext-{option.replace('_', '-')}"
    args = sglang_harness.parse_server_args("--enable-prefill-ext", flag, value)
    assert args.prefill_ext_options == {option: parsed}


SPARSE_BACKENDS = getattr(adapters.current("hooks"), "ATTENTION_BACKENDS", ())
CONFIG_ONLY_MODEL = str(Path(__file__).resolve().parents[2] / "bench" / "models" / "llama3-8b-dummy")


def _skip_unless_sparse_is_served() -> None:
    if PORTED is not None and "sparse" not in PORTED:
        pytest.skip("--prefill-ext-sparse is not served by this SGLang version")


@pytest.mark.parametrize("backend", ["flashinfer", "fa3"])
def test_sparse_runs_on_the_flashinfer_and_fa3_backends(sglang_harness: ModuleType, backend: str) -> None:
    _skip_unless_sparse_is_served()
    args = sglang_harness.parse_server_args(
        "--enable-prefill-ext", "--prefill-ext-sparse", "--attention-backend", backend
    )
    assert args.prefill_ext_options == {"sparse": True}
    assert backend in SPARSE_BACKENDS


@pytest.mark.parametrize(
    "argv",
    [
        ("--attention-backend", "triton"),
        ("--attention-backend", "flashinfer", "--prefill-attention-backend", "triton"),
    ],
)
def test_sparse_on_another_prefill_backend_refused(sglang_harness: ModuleType, argv: tuple[str, ...]) -> None:
    _skip_unless_sparse_is_served()
    with pytest.raises(
        ValueError,
        match="--prefill-ext-sparse needs the flashinfer or fa3 attention backend; "
        "this server's prefill runs on triton",
    ):
        sglang_harness.parse_server_args("--enable-prefill-ext", "--prefill-ext-sparse", *argv)
    # the backend alone is no reason to refuse the extension
    assert sglang_harness.parse_server_args("--enable-prefill-ext", *argv).enable_prefill_ext


@pytest.mark.parametrize(("hopper", "picked"), [(True, "fa3"), (False, "triton")])
def test_sparse_checked_against_the_backend_sglang_picks(
    sglang_harness: ModuleType, monkeypatch: pytest.MonkeyPatch, hopper: bool, picked: str
) -> None:
    """No backend flag: SGLang's own `_get_default_attn_backend` picks one at the end of `__post_init__`
    (fa3 for a Llama on Hopper; on this CUDA-less box without the probe, triton) and validation sees it.
    The Hopper probe stands in for the H200."""
    _skip_unless_sparse_is_served()
    import sglang.srt.server_args as server_args_module

    monkeypatch.setattr(server_args_module, "is_hopper_with_cuda_12_3", lambda: hopper)
    model = ("--model-path", CONFIG_ONLY_MODEL, "--device", "cuda")
    assert sglang_harness.parse_server_args(*model).attention_backend == picked
    argv = (*model, "--enable-prefill-ext", "--prefill-ext-sparse")
    if picked in SPARSE_BACKENDS:
        assert sglang_harness.parse_server_args(*argv).prefill_ext_options == {"sparse": True}
    else:
        with pytest.raises(ValueError, match=f"prefill runs on {picked}"):
            sglang_harness.parse_server_args(*argv)


@pytest.mark.parametrize("page_size", [1, 16])
def test_stock_tree_cache_with_flag_off(sglang_harness: ModuleType, page_size: int) -> None:
    cache = sglang_harness.build_tree_cache(sglang_harness.parse_server_args(), page_size)
    assert type(cache) is sglang_harness.STOCK_TREE_CACHE


@pytest.mark.parametrize("page_size", [1, 16])
def test_extension_tree_cache_with_flag_on(sglang_harness: ModuleType, page_size: int) -> None:
    server_args = sglang_harness.parse_server_args("--enable-prefill-ext", "--prefill-ext-eviction", "cost")
    cache = sglang_harness.build_tree_cache(server_args, page_size)
    assert type(cache) is adapters.current("radix_cache").PrefillExtRadixCache
    assert cache.page_size == page_size
    assert cache.evictable_size() == 0 and cache.protected_size() == 0
