"""On the GPU: the extension's subclass of SGLang 0.5.17's fa3 backend (`FlashAttentionBackend`) against
the stock backend, over the same real KV pool, request rows and attention layers.

A sparse batch that keeps every block equals stock fa3's dense attention and fp32 SDPA (bf16 tolerance);
a batch the path does not take, and one whose layout it declines, are bit-identical to stock fa3. The
model runner is the handful of fields the backends read (no model is loaded)."""

from __future__ import annotations

import types

import pytest
import torch
from kvpool import Pool, assert_requests_match_sdpa

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
LAYERS = 3


def _fa3():
    """The fa3 backend module (sgl_kernel needs a CUDA driver even to import; the FA3 kernels are its
    1.1 GB `flash_ops`, which a slim install may lack: the skip reason says so)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip(
        "sgl_kernel.flash_attn", reason="sgl_kernel's FA3 kernels (flash_ops) are not installed"
    )
    return pytest.importorskip("sglang.srt.layers.attention.flashattention_backend")


def _model_runner(server_args, ctx: int, page_size: int, heads: tuple[int, int], head_dim: int):
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.runtime_context import publish

    publish(server_args, role="test")
    slots = 4 * ctx + 4 * page_size
    model_config = types.SimpleNamespace(
        is_encoder_decoder=False,
        context_len=ctx,
        attention_arch=AttentionArch.MHA,
        is_local_attention_model=False,
        head_dim=head_dim,
        hf_text_config=types.SimpleNamespace(num_attention_heads=heads[0]),
        get_num_kv_heads=lambda tp_size: heads[1],
    )
    return types.SimpleNamespace(
        server_args=server_args,
        model_config=model_config,
        sliding_window_size=None,
        device=DEVICE,
        req_to_token_pool=ReqToTokenPool(4, ctx, DEVICE, False),
        token_to_kv_pool=MHATokenToKVPool(
            slots, page_size, torch.bfloat16, heads[1], head_dim, LAYERS, DEVICE, False
        ),
        token_to_kv_pool_allocator=None,
        kv_cache_dtype=torch.bfloat16,
        kv_cache_dtype_str="auto",
        page_size=page_size,
        ps=types.SimpleNamespace(attn_cp_size=1, tp_size=1),
        is_draft_worker=False,
    )


def _batch(runner, prefix: list[int], extend: list[int], seed: int = 0):
    """Requests on page-aligned slots handed out in a random order; each cached prefix's K/V already in
    every layer of the pool. Returns the ForwardBatch and the new tokens' K/V per layer."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    gen = torch.Generator().manual_seed(seed)
    page = runner.page_size
    pool = runner.token_to_kv_pool
    rows = torch.arange(1, len(prefix) + 1)
    ctx = [p + n for p, n in zip(prefix, extend, strict=True)]
    pages = torch.randperm(pool.size // page - 1, generator=gen) + 1
    used, new_locs = 0, []
    for row, (p, length) in zip(rows.tolist(), zip(prefix, ctx, strict=True), strict=True):
        count = -(-length // page)
        locs = (pages[used : used + count, None] * page + torch.arange(page)).flatten()[:length]
        used += count
        runner.req_to_token_pool.req_to_token[row, :length] = locs.to(torch.int32).to(DEVICE)
        for layer_id in range(LAYERS):
            k_buffer, v_buffer = pool.get_kv_buffer(layer_id)
            shape = (p, *k_buffer.shape[1:])
            k_buffer[locs[:p].to(DEVICE)] = torch.randn(shape, generator=gen).bfloat16().to(DEVICE)
            v_buffer[locs[:p].to(DEVICE)] = torch.randn(shape, generator=gen).bfloat16().to(DEVICE)
        new_locs.append(locs[p:])
    out_cache_loc = torch.cat(new_locs).to(DEVICE)
    num_tokens = sum(extend)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(prefix),
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=DEVICE),
        req_pool_indices=rows.to(DEVICE),
        seq_lens=torch.tensor(ctx, device=DEVICE),
        out_cache_loc=out_cache_loc,
        seq_lens_sum=sum(ctx),
        seq_lens_cpu=torch.tensor(ctx),
        extend_num_tokens=num_tokens,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32, device=DEVICE),
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=DEVICE),
        extend_seq_lens_cpu=list(extend),
        extend_prefix_lens_cpu=list(prefix),
    )
    kv_shape = (num_tokens, pool.head_num, pool.head_dim)
    new_kv = [
        (
            torch.randn(kv_shape, generator=gen).bfloat16().to(DEVICE),
            torch.randn(kv_shape, generator=gen).bfloat16().to(DEVICE),
        )
        for _ in range(LAYERS)
    ]
    return batch, new_kv


def _layers(heads: tuple[int, int], head_dim: int):
    from sglang.srt.layers.radix_attention import RadixAttention

    return [RadixAttention(heads[0], head_dim, head_dim**-0.5, heads[1], i) for i in range(LAYERS)]


def _forward(backend, batch, new_kv, queries, layers) -> list[torch.Tensor]:
    """Every layer's extend attention through `backend`, as the model runner calls it."""
    backend.init_forward_metadata(batch)
    return [
        backend.forward_extend(q, k, v, layer, batch)
        for q, (k, v), layer in zip(queries, new_kv, layers, strict=True)
    ]


def _ext_config(**options):
    from sglang_prefill_ext.config import PrefillExtConfig

    return PrefillExtConfig.from_options(
        {
            "sparse": True,
            "sparse_min_len": 2048,
            "sparse_min_extend": 256,
            "sparse_dense_layers": 1,
            **options,
        }
    )


KEEP_ALL = {"sparse_scorer": "hybrid", "sparse_threshold": 0.0, "sparse_mass": 1.0}


@pytest.fixture
def server_args(sglang_harness):
    return sglang_harness.parse_server_args("--attention-backend", "fa3")


@pytest.mark.parametrize("plan_once", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("heads", "head_dim"), [((32, 8), 128), ((28, 4), 64)])
def test_sparse_batch_keeping_every_block_equals_dense_attention(
    server_args, page_size: int, heads: tuple[int, int], head_dim: int, plan_once: bool
) -> None:
    """Every sparse layer against stock fa3 and fp32 SDPA; with `--prefill-ext-sparse-plan-once` the layers
    after the first sparse one run its fa2 plan over their own device-built indices."""
    fa3 = _fa3()
    from sglang_prefill_ext.adapters.v0_5_17.flashattention import PrefillExtFlashAttentionBackend

    prefix, extend = [1500, 0], [1700, 900]
    runner = _model_runner(server_args, 4096, page_size, heads, head_dim)
    batch, new_kv = _batch(runner, prefix, extend)
    layers = _layers(heads, head_dim)
    queries = [torch.randn(sum(extend), heads[0] * head_dim, device=DEVICE).bfloat16() for _ in layers]
    config = _ext_config(sparse_max_density=1.0, sparse_plan_once=plan_once, **KEEP_ALL)
    ext = PrefillExtFlashAttentionBackend(runner, config)
    assert ext.extend_path_supported() and ext.wants_eager_prefill(batch)
    got = _forward(ext, batch, new_kv, queries, layers)
    assert ext.ext_path.sparse.planned and ext.ext_path.sparse.density() == pytest.approx(1.0)
    want = _forward(fa3.FlashAttentionBackend(runner), batch, new_kv, queries, layers)
    assert torch.equal(got[0], want[0])  # the first layer stays on fa3
    pool = runner.token_to_kv_pool
    for layer_id in range(1, LAYERS):
        torch.testing.assert_close(got[layer_id], want[layer_id], atol=1e-2, rtol=2e-2)
        k_buffer, v_buffer = pool.get_kv_buffer(layer_id)
        view = Pool(k_buffer, v_buffer, runner.req_to_token_pool.req_to_token, batch.req_pool_indices)
        q = queries[layer_id].view(-1, heads[0], head_dim)
        assert_requests_match_sdpa(got[layer_id].view_as(q), q, view, prefix, extend)


@pytest.mark.parametrize("page_size", [1, 16])
def test_batches_the_path_does_not_take_are_stock_fa3_bit_for_bit(server_args, page_size: int) -> None:
    """A short batch (below sparse_min_len) and a sparse batch whose layout is declined (every block kept,
    density 1 > the default 0.6 limit at the first sparse layer) run stock fa3 in every layer."""
    fa3 = _fa3()
    from sglang_prefill_ext.adapters.v0_5_17.flashattention import PrefillExtFlashAttentionBackend

    heads, head_dim = (32, 8), 128
    runner = _model_runner(server_args, 4096, page_size, heads, head_dim)
    layers = _layers(heads, head_dim)
    ext = PrefillExtFlashAttentionBackend(runner, _ext_config(**KEEP_ALL))
    stock = fa3.FlashAttentionBackend(runner)
    for prefix, extend, taken in (([300, 0], [500, 700], False), ([1500, 0], [1700, 900], True)):
        batch, new_kv = _batch(runner, prefix, extend, seed=len(prefix) + sum(extend))
        queries = [torch.randn(sum(extend), heads[0] * head_dim, device=DEVICE).bfloat16() for _ in layers]
        assert ext.wants_eager_prefill(batch) is taken
        got = _forward(ext, batch, new_kv, queries, layers)
        want = _forward(stock, batch, new_kv, queries, layers)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        if taken:
            assert not ext.ext_path.sparse.planned and ext.ext_path.sparse.density() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("use_mla", True),
        ("has_swa", True),
        ("has_local_attention", True),
        ("is_encoder_decoder", True),
        ("attn_cp_size", 2),
        ("fa_skip_kv_cache", True),
        ("num_splits", 1),
        ("kv_cache_dtype_str", "fp8_e4m3"),
    ],
)
def test_unsupported_fa3_configurations_stay_stock(server_args, attr: str, value: object) -> None:
    _fa3()
    from sglang_prefill_ext.adapters.v0_5_17.flashattention import PrefillExtFlashAttentionBackend

    runner = _model_runner(server_args, 4096, 1, (32, 8), 128)
    backend = PrefillExtFlashAttentionBackend(runner, _ext_config())
    batch, _ = _batch(runner, [0], [3000])
    assert backend.wants_eager_prefill(batch)
    setattr(backend, attr, value)
    assert not backend.wants_eager_prefill(_batch(runner, [0], [3000])[0])


def test_the_fa3_hook_builds_the_extension_backend_only_with_sparse(sglang_harness) -> None:
    fa3 = _fa3()
    from sglang_prefill_ext.adapters.v0_5_17 import hooks
    from sglang_prefill_ext.adapters.v0_5_17.flashattention import PrefillExtFlashAttentionBackend

    for argv, cls in (
        ((), fa3.FlashAttentionBackend),
        (("--enable-prefill-ext",), fa3.FlashAttentionBackend),
        (("--enable-prefill-ext", "--prefill-ext-sparse"), PrefillExtFlashAttentionBackend),
    ):
        server_args = sglang_harness.parse_server_args("--attention-backend", "fa3", *argv)
        backend = hooks.create_attention_backend(_model_runner(server_args, 4096, 1, (32, 8), 128), "fa3")
        assert type(backend) is cls
