"""Which batches and layers the 0.5.17 backend sends down the sparse and dense paths (no GPU, no model)."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.flashinfer_backend")

from sglang.srt.layers.radix_attention import AttentionType  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_prefill_ext.adapters.v0_5_17.attention import PrefillExtFlashInferBackend  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.dense import DenseExtend  # noqa: E402
from sglang_prefill_ext.adapters.v0_5_17.extend_path import ExtendPath  # noqa: E402
from sglang_prefill_ext.config import PrefillExtConfig  # noqa: E402
from sglang_prefill_ext.ops import BlockLayout  # noqa: E402


def _backend(**options) -> PrefillExtFlashInferBackend:
    backend = PrefillExtFlashInferBackend.__new__(PrefillExtFlashInferBackend)
    backend.ext_config = PrefillExtConfig.from_options({"sparse": True, "sparse_min_len": 1000, **options})
    backend.dispatch_reason = None
    backend.enable_mis = False
    backend.prefill_uses_dequant_workspace = False
    backend.flashinfer_kv_cache_dtype = torch.bfloat16
    backend._first_sparse_layer = backend.ext_config.sparse_dense_layers
    backend._sparse_batch = None
    backend.is_multimodal = False
    backend.enable_deterministic = False
    backend.indices_updater_prefill = types.SimpleNamespace(q_data_type=torch.bfloat16)
    backend.cascade = backend.dense = None
    backend._paths = []
    if backend.ext_config.dense:
        # the path's decisions only: its FlashInfer wrapper is built on the GPU
        backend.dense = DenseExtend.__new__(DenseExtend)
        ExtendPath.__init__(backend.dense, backend, backend.ext_config, None)
        backend._paths = [backend.dense]
    return backend


def _batch(
    mode: ForwardMode = ForwardMode.EXTEND,
    seq_lens: tuple[int, ...] = (1200, 40),
    prefix_lens: tuple[int, ...] | None = None,
):
    prefix = list(prefix_lens or [0] * len(seq_lens))
    return types.SimpleNamespace(
        forward_mode=mode,
        req_pool_indices=torch.arange(len(seq_lens)),
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=[s - p for s, p in zip(seq_lens, prefix, strict=True)],
        seq_lens_cpu=torch.tensor(seq_lens),
    )


def _layer(layer_id: int, **overrides):
    fields = dict(
        layer_id=layer_id, is_cross_attention=False, attn_type=AttentionType.DECODER, sliding_window_size=-1
    )
    return types.SimpleNamespace(**{**fields, **overrides})


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
    assert not _backend(sparse=False).wants_eager_prefill(_batch())


def test_a_long_request_needs_enough_new_tokens_to_go_sparse() -> None:
    backend = _backend(sparse_min_extend=256)
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_999,)))  # cache hit
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_745,)))
    assert backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_744,)))
    # the new tokens must belong to a long request: a hit plus a short fresh prompt stays dense
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000, 900), prefix_lens=(99_999, 0)))
    # a fresh 2,000-token prompt is long in its own right here (min_len 1000)
    assert backend.wants_eager_prefill(_batch(seq_lens=(100_000, 2000), prefix_lens=(99_999, 0)))
    assert _backend().ext_config.sparse_min_extend == 1024


def test_unsupported_models_and_caches_stay_stock() -> None:
    for attr, value in (
        ("dispatch_reason", "sliding"),
        ("enable_mis", True),
        ("flashinfer_kv_cache_dtype", torch.float8_e4m3fn),
    ):
        backend = _backend()
        setattr(backend, attr, value)
        assert not backend.wants_eager_prefill(_batch())


def test_dense_layers_other_batches_and_special_layers_run_stock() -> None:
    backend = _backend(sparse_dense_layers=2)
    batch = _batch()
    layout = BlockLayout.build([0, 0], [1200, 40], 128)
    backend.sparse = types.SimpleNamespace(layout=layout)
    backend._sparse_batch = batch
    q, k = torch.empty(1240, 4), torch.empty(1240, 4)
    assert backend._runs_sparse(q, k, _layer(2), batch)
    assert not backend._runs_sparse(q, k, _layer(1), batch)
    assert not backend._runs_sparse(q, k, _layer(2), _batch())  # e.g. a graph replay's static batch
    assert not backend._runs_sparse(torch.empty(2048, 4), k, _layer(2), batch)  # padded tokens
    assert not backend._runs_sparse(q, None, _layer(2), batch)
    assert not backend._runs_sparse(q, k, _layer(3, is_cross_attention=True), batch)
    assert not backend._runs_sparse(q, k, _layer(3, attn_type=AttentionType.ENCODER_ONLY), batch)
    assert not backend._runs_sparse(q, k, _layer(3, sliding_window_size=4096), batch)


def test_dense_path_takes_batches_with_enough_new_tokens() -> None:
    backend = _backend(sparse=False, dense=True, dense_min_extend=512)
    assert backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_488,)))
    assert backend.wants_eager_prefill(_batch(seq_lens=(600, 40)))  # a fresh prompt counts too
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000,), prefix_lens=(99_489,)))
    assert not backend.wants_eager_prefill(_batch(seq_lens=(100_000, 300), prefix_lens=(99_999, 0)))
    assert not backend.wants_eager_prefill(_batch(ForwardMode.DECODE, seq_lens=(5000,)))
    for attr, value in (
        ("enable_deterministic", True),
        ("is_multimodal", True),
        ("dispatch_reason", "sliding"),
    ):
        other = _backend(sparse=False, dense=True)
        setattr(other, attr, value)
        assert not other.wants_eager_prefill(_batch(seq_lens=(5000,)))
    assert _backend(sparse=False, dense=True).ext_config.dense_min_extend == 1024


def test_dense_path_runs_only_its_batch_and_plain_layers() -> None:
    backend = _backend(sparse=False, dense=True)
    batch = _batch(seq_lens=(9000, 3000), prefix_lens=(4000, 0))
    assert backend.dense.begin(batch)
    q, k = torch.empty(8000, 4), torch.empty(8000, 4)
    assert backend.dense.runs(q, k, _layer(0), batch)
    assert not backend.dense.runs(q, k, _layer(0), _batch(seq_lens=(9000, 3000), prefix_lens=(4000, 0)))
    assert not backend.dense.runs(torch.empty(8192, 4), k, _layer(0), batch)  # padded tokens
    assert not backend.dense.runs(q, k, _layer(0, sliding_window_size=4096), batch)
    assert not backend.dense.begin(None)
    assert not backend.dense.runs(q, k, _layer(0), batch)


class _Recorder:
    """Stands in for an ops attention (FlashInfer needs a GPU): records plans, returns zeros."""

    def __init__(self) -> None:
        self.plans = 0
        self.runs = 0

    def plan(self, *args, **kwargs) -> None:
        self.plans += 1

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return torch.zeros_like(q)


def test_a_too_dense_sparse_layout_hands_the_batch_to_the_dense_path() -> None:
    """Threshold 0 keeps every block (density 1 > the 0.6 limit): the first sparse layer declines after
    writing K/V once; it and every later layer run the dense path, which writes no K/V twice."""
    from sglang_prefill_ext.ops import BlockSparsePrefill, SparsePrefill, SparseSettings

    backend = _backend(dense=True, sparse_scorer="pooled", sparse_threshold=0.0, sparse_block_size=128)
    writes = []
    pool_k = torch.randn(4096, 2, 16)
    backend.token_to_kv_pool = types.SimpleNamespace(
        get_kv_buffer=lambda layer_id: (pool_k, pool_k),
        set_kv_buffer=lambda layer, loc, k, v, *scales: writes.append(layer.layer_id),
    )
    backend.kv_cache_quant_method = types.SimpleNamespace(needs_global_scale=lambda: True)
    backend.forward_metadata = types.SimpleNamespace(swa_out_cache_loc=None)
    backend.req_to_token_pool = types.SimpleNamespace(req_to_token=torch.arange(3000)[None])
    recorder = _Recorder()
    backend.dense._attention = recorder
    backend.sparse = SparsePrefill(
        SparseSettings(scorer="pooled", threshold=0.0), BlockSparsePrefill.__new__(BlockSparsePrefill)
    )
    batch = _batch(seq_lens=(3000,))
    batch.out_cache_loc = torch.arange(3000)
    layout = BlockLayout.build([0], [3000], 128)
    backend.sparse.begin(layout, torch.arange(3000))
    backend._sparse_batch = batch
    assert backend.dense.begin(batch)
    layer = dict(
        tp_q_head_num=4, tp_k_head_num=2, head_dim=16, scaling=0.25, logit_cap=0.0, k_scale=None, v_scale=None
    )
    q, k = torch.randn(3000, 64), torch.randn(3000, 32)
    for layer_id in (2, 3):
        out = backend.forward_extend(q, k, k, _layer(layer_id, **layer), batch)
        assert out.shape == (3000, 64)
    assert backend._sparse_batch is None and not backend.sparse.planned
    assert backend.sparse.density() == pytest.approx(1.0)
    assert writes == [2, 3]  # layer 2 by the sparse path before it declined, layer 3 by the dense path
    assert (recorder.plans, recorder.runs) == (1, 2)
