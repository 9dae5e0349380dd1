"""Which batches and layers the 0.5.17 extension backends send down the sparse extend path (no GPU, no
model): SGLang's real FlashInfer backend subclass, KV pool and attention layers on the CPU."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.flashinfer_backend")

from sglang.srt.layers.radix_attention import AttentionType, RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from bench.accuracy import guard_rate  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.flashinfer import PrefillExtFlashInferBackend  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.sparse import SparseExtend  # noqa: E402
from sglang_prefill_ext.config import PrefillExtConfig  # noqa: E402
from sglang_prefill_ext.ops import BlockSparseAttention, SparsePrefill  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS, SLOTS = 4, 2, 16, 4, 4096


def _backend(**options) -> PrefillExtFlashInferBackend:
    """The extension's FlashInfer backend with the attributes its decisions read, over a real CPU KV pool
    (FlashInfer's wrappers need a GPU, so its `__init__` does not run)."""
    backend = PrefillExtFlashInferBackend.__new__(PrefillExtFlashInferBackend)
    config = PrefillExtConfig.from_options({"sparse": True, "sparse_min_len": 1000, **options})
    backend.dispatch_reason = None
    backend.enable_mis = False
    backend.enable_deterministic = False
    backend.prefill_uses_dequant_workspace = False
    backend.flashinfer_kv_cache_dtype = torch.bfloat16
    backend.indices_updater_prefill = types.SimpleNamespace(q_data_type=torch.bfloat16)
    backend.token_to_kv_pool = MHATokenToKVPool(
        SLOTS, 1, torch.bfloat16, KV_HEADS, HEAD_DIM, LAYERS, "cpu", False, enable_alt_stream=False
    )
    backend.req_to_token_pool = types.SimpleNamespace(
        req_to_token=torch.arange(SLOTS, dtype=torch.int32)[None]
    )
    backend.forward_metadata = types.SimpleNamespace(swa_out_cache_loc=None)
    backend.kv_cache_quant_method = types.SimpleNamespace(needs_global_scale=lambda: False)
    attention = BlockSparseAttention.__new__(BlockSparseAttention)  # its FlashInfer wrapper needs a GPU
    backend.ext_path = SparseExtend(backend, config, SparsePrefill(config.sparse_settings, attention))
    return backend


def _batch(
    mode: ForwardMode = ForwardMode.EXTEND,
    seq_lens: tuple[int, ...] = (1200, 40),
    prefix_lens: tuple[int, ...] | None = None,
    prompt_lens: tuple[int, ...] | None = None,
):
    """`prompt_lens`: SGLang's `orig_seq_lens` (default `seq_lens`: every extend ends its prompt)."""
    prefix = list(prefix_lens or [0] * len(seq_lens))
    extend = [s - p for s, p in zip(seq_lens, prefix, strict=True)]
    return types.SimpleNamespace(
        forward_mode=mode,
        req_pool_indices=torch.zeros(len(seq_lens), dtype=torch.int64),
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=extend,
        out_cache_loc=torch.arange(sum(extend)),
        seq_lens=torch.tensor(seq_lens),
        orig_seq_lens=torch.tensor(prompt_lens or seq_lens, dtype=torch.int32),
    )


def _layer(layer_id: int, **overrides) -> RadixAttention:
    return RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, layer_id, **overrides)


def test_only_long_plain_extend_batches_go_sparse() -> None:
    backend = _backend()
    assert backend.wants_eager_prefill(_batch())
    assert backend.wants_eager_prefill(_batch(ForwardMode.MIXED))
    assert not backend.wants_eager_prefill(_batch(seq_lens=(999, 40)))
    for mode in (
        ForwardMode.DECODE,
        ForwardMode.TARGET_VERIFY,
        ForwardMode.DRAFT_EXTEND_V2,
        ForwardMode.IDLE,
    ):
        assert not backend.wants_eager_prefill(_batch(mode))


def test_a_long_request_needs_enough_new_tokens_to_go_sparse() -> None:
    backend = _backend(sparse_min_extend=256)
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_999,)))  # cache hit
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_745,)))
    assert backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_744,)))
    # the new tokens must belong to a long request: a hit plus a short fresh prompt stays on the backend
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000, 900), prefix_lens=(99_999, 0)))
    # a fresh 2,000-token prompt is long in its own right here (min_len 1000)
    assert backend.wants_eager_prefill(_batch(seq_lens=(100_000, 2000), prefix_lens=(99_999, 0)))
    assert PrefillExtConfig().sparse_min_extend == 1024


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("dispatch_reason", "sliding"),
        ("enable_mis", True),
        ("enable_deterministic", True),
        ("prefill_uses_dequant_workspace", True),
        ("flashinfer_kv_cache_dtype", torch.float8_e4m3fn),
    ],
)
def test_unsupported_models_and_caches_stay_on_the_backend(attr: str, value: object) -> None:
    backend = _backend()
    setattr(backend, attr, value)
    assert not backend.wants_eager_prefill(_batch())


def test_first_layers_other_batches_and_special_layers_run_the_backend() -> None:
    backend = _backend(sparse_dense_layers=2)
    batch = _batch()
    assert backend.ext_path.begin(batch)
    path = backend.ext_path
    q, k = torch.empty(1240, HEADS * HEAD_DIM), torch.empty(1240, KV_HEADS * HEAD_DIM)
    assert path.runs(q, k, _layer(2), batch)
    assert not path.runs(q, k, _layer(1), batch)
    assert not path.runs(q, k, _layer(2), _batch())  # e.g. a graph replay's static batch
    assert not path.runs(torch.empty(2048, HEADS * HEAD_DIM), k, _layer(2), batch)  # padded tokens
    assert not path.runs(q, None, _layer(2), batch)
    assert not path.runs(q, k, _layer(3, is_cross_attention=True), batch)
    for attn_type in (AttentionType.ENCODER_ONLY, AttentionType.DECODER_BIDIRECTIONAL):
        assert not path.runs(q, k, _layer(3, attn_type=attn_type), batch)
    assert not path.runs(q, k, _layer(3, sliding_window_size=4096), batch)
    assert path.runs(q, k, _layer(3, logit_cap=30.0), batch)
    assert not path.begin(None)  # under graph capture: nothing taken
    assert not path.runs(q, k, _layer(2), batch)
    assert not path.begin(_batch(seq_lens=(999,)))


def test_extra_attention_inputs_keep_the_backends_attention() -> None:
    """A call with e.g. attention sinks never reaches the path (it would attend without them)."""
    backend = _backend()
    batch = _batch()
    backend.ext_path.begin(batch)
    reached = []
    backend.ext_path.forward = lambda *args: reached.append(args)
    q, k = torch.zeros(1240, HEADS * HEAD_DIM), torch.zeros(1240, KV_HEADS * HEAD_DIM)
    with pytest.raises(TypeError):  # stock FlashInfer takes no sinks: the call went to it
        backend.forward_extend(q, k, k, _layer(3), batch, sinks=torch.zeros(HEADS))
    assert not reached


def test_a_too_dense_layout_is_declined_after_writing_kv_once() -> None:
    """Threshold 0 keeps every block (density 1 > the 0.6 limit): the first sparse layer writes its K/V,
    then declines; neither it nor a later layer runs the path again (the backend's attention does)."""
    backend = _backend(sparse_scorer="pooled", sparse_threshold=0.0, sparse_dense_layers=2)
    path = backend.ext_path
    batch = _batch(seq_lens=(3000,))
    assert path.begin(batch)
    q = torch.randn(3000, HEADS * HEAD_DIM).bfloat16()
    k = torch.randn(3000, KV_HEADS, HEAD_DIM).bfloat16()
    assert path.runs(q, k, _layer(2), batch)
    assert path.forward(q, k, k, _layer(2), batch, save_kv_cache=True) is None
    written, _ = backend.token_to_kv_pool.get_kv_buffer(2)
    torch.testing.assert_close(written[:3000], k)
    assert not backend.token_to_kv_pool.get_kv_buffer(3)[0].any()
    assert not path.sparse.planned and path.sparse.density() == pytest.approx(1.0)
    assert not path.runs(q, k, _layer(3), batch)


def test_the_first_sparse_layer_alone_may_decline() -> None:
    """Past the first sparse layer the limit is off: a layer there plans whatever it selects."""
    backend = _backend(sparse_scorer="pooled", sparse_threshold=0.0, sparse_dense_layers=0)
    path = backend.ext_path
    batch = _batch(seq_lens=(3000,))
    path.begin(batch)
    planned = []
    path.sparse.plan = lambda mask, *args, **kwargs: planned.append(float(mask.float().mean()))
    path.sparse.attention.run = lambda q, k_buffer, v_buffer: torch.zeros_like(q)
    q = torch.randn(3000, HEADS * HEAD_DIM).bfloat16()
    k = torch.randn(3000, KV_HEADS, HEAD_DIM).bfloat16()
    out = path.forward(q, k, k, _layer(1), batch, save_kv_cache=True)
    assert out is not None and out.shape == q.shape and len(planned) == 1


def test_the_layout_knows_each_prompt_and_which_extends_end_it() -> None:
    """From SGLang's `orig_seq_lens` on the device: a chunk short of the prompt's length does not end it, so
    its last rows are not kept dense (`SparseSettings.last_blocks`), and it selects at its whole prompt's mass."""
    from sglang_prefill_ext.adapters.v0_5_17.sparse import prompt_lens

    batch = _batch(seq_lens=(2048, 40, 1500), prefix_lens=(0, 0, 1000), prompt_lens=(100_000, 40, 1499))
    assert prompt_lens(batch).tolist() == [100_000, 40, 1499]
    backend = _backend()
    assert backend.ext_path.begin(batch)
    layout = backend.ext_path.sparse.layout
    assert layout.req_ends_prompt.tolist() == [False, True, True]
    assert layout.req_prompt_len.tolist() == [100_000, 40, 1500]


def _guarded_path(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, **options):
    """A path over one 3,000-token prompt whose selection drops blocks (sampled rows at mass 0.5), its
    density never declined, its plan and attention stubbed (FlashInfer needs a GPU). The ops run their torch
    versions: Triton's CPU interpreter gets bf16 dot products wrong (the pool's dtype)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    caplog.set_level(logging.INFO, logger="sglang_prefill_ext.adapters.v0_5_17.sparse")
    backend = _backend(sparse_scorer="sampled", sparse_mass=0.5, sparse_max_density=1.0, **options)
    path = backend.ext_path
    batch = _batch(seq_lens=(3000,))
    path.begin(batch)
    path.sparse.plan = lambda mask, *args, **kwargs: None
    path.sparse.attention.run = lambda q, k_buffer, v_buffer: torch.zeros_like(q)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3000, HEADS * HEAD_DIM, generator=gen).bfloat16()
    k = torch.randn(3000, KV_HEADS, HEAD_DIM, generator=gen).bfloat16()
    return path, batch, q, k


def test_a_failed_guard_declines_the_first_sparse_layer_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, batch, q, k = _guarded_path(caplog, monkeypatch, sparse_guard=1.0)
    assert path.forward(q, k, k, _layer(0), batch, save_kv_cache=True) is None
    assert not path.runs(q, k, _layer(1), batch)
    guard = path.sparse.guard_stats[0]
    assert guard < 1.0
    (line,) = caplog.messages
    assert line.endswith(f", guard {guard:.3f} < --prefill-ext-sparse-guard: the backend's dense prefill")


def test_a_passed_guard_is_logged_and_a_later_layer_may_decline(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """guard_every 2: layers 1 and 3 are not checked, 2 is, its statistic logged whether it passes or declines;
    a decline there leaves layers 0 and 1 sparse."""
    path, batch, q, k = _guarded_path(caplog, monkeypatch, sparse_guard=1e-9, sparse_guard_every=2)
    for layer in range(4):
        assert path.forward(q, k, k, _layer(layer), batch, save_kv_cache=True) is not None
    assert sorted(path.sparse.guard_stats) == [0, 2]
    first, passed = caplog.messages
    assert first.endswith(f"density {path.sparse.density():.3f}, guard {path.sparse.guard_stats[0]:.3f}")
    assert passed == f"prefill-ext sparse: sparse layer 2, guard {path.sparse.guard_stats[2]:.3f}"
    (parsed,) = guard_rate.forwards(caplog.messages)  # the decline-rate tool reads these very lines
    assert parsed.guard == {layer: round(g, 3) for layer, g in path.sparse.guard_stats.items()}
    caplog.clear()
    path.begin(batch)
    assert path.forward(q, k, k, _layer(0), batch, save_kv_cache=True) is not None
    path.sparse.settings = dataclasses.replace(path.sparse.settings, guard=1.0)
    assert path.forward(q, k, k, _layer(1), batch, save_kv_cache=True) is not None
    assert path.forward(q, k, k, _layer(2), batch, save_kv_cache=True) is None
    assert not path.runs(q, k, _layer(3), batch)
    _, declined = caplog.messages
    assert declined == (
        f"prefill-ext sparse: sparse layer 2, guard {path.sparse.guard_stats[2]:.3f} < "
        "--prefill-ext-sparse-guard: the backend's dense prefill"
    )
