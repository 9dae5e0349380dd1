"""The functions SGLang 0.5.17 calls once patched; each patch hook is a single call into here.

This module is imported by the patched `sglang.srt.server_args`, so it imports nothing from
SGLang at module level (that would be circular) and nothing heavy. The version-free parts live
in `sglang_prefill_ext.adapters.common`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang_prefill_ext.adapters import common
from sglang_prefill_ext.blend.spans import Span, parse_chunk_spans
from sglang_prefill_ext.config import OptionError, option_name

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

add_cli_args = common.add_cli_args
extension_enabled = common.extension_enabled

# 0.5.17 adds no conflicts of its own to the common ones, and serves every option.
CONFLICTING_FLAGS = common.conflicting_flags()
PORTED_OPTIONS = None
# The prefill attention backends the extension subclasses (`create_attention_backend`).
ATTENTION_BACKENDS = ("flashinfer", "fa3")
# What --prefill-ext-yield-layers cannot be combined with: ServerArgs field -> why. It slices in the
# normal event loop, one forward stream, one model rank; pdmux owns split prefill itself.
YIELD_LAYERS_CONFLICTS = {
    "enable_pdmux": "--enable-pdmux (it runs its own split prefill)",
    "speculative_algorithm": "--speculative-algorithm (a draft model's forwards are not sliced)",
    "enable_dp_attention": "--enable-dp-attention (every DP rank would have to slice alike)",
    "enable_two_batch_overlap": "--enable-two-batch-overlap",
}


def validate_server_args(server_args: ServerArgs) -> None:
    """Refuse, before any model loads, a configuration the extension cannot serve correctly (at the
    start of `ServerArgs.__post_init__`: an attention backend given by flag is checked here)."""
    common.validate_server_args(server_args, CONFLICTING_FLAGS, PORTED_OPTIONS, "0.5.17")
    common.validate_attention_backend(server_args, ATTENTION_BACKENDS)
    validate_yield_layers(server_args)
    validate_blend(server_args)


def validate_yield_layers(server_args: ServerArgs) -> None:
    """Refuse --prefill-ext-yield-layers where the sliced pass could not run: the overlap event loop
    (its pending result is not sliced), pipeline parallelism, LoRA adapters, block-sparse prefill, or
    a YIELD_LAYERS_CONFLICTS flag."""
    ext_config = common.prefill_ext_config(server_args)
    if ext_config is None or not ext_config.yield_layers:
        return
    flag = option_name("yield_layers")
    if not server_args.disable_overlap_schedule:
        raise OptionError(
            f"{flag} needs --disable-overlap-schedule (the slices run in SGLang's normal event loop; the "
            "overlap loop's pending result is not sliced yet)"
        )
    found = [why for name, why in YIELD_LAYERS_CONFLICTS.items() if getattr(server_args, name, None)]
    if server_args.pp_size > 1:
        found.append("--pp-size above 1 (a slice's layers would span pipeline stages)")
    if server_args.enable_lora or server_args.lora_paths:
        # ForwardBatch.init_new sets the LoRA manager's one batch info; a pass between two slices resets it
        found.append("LoRA adapters (the pass between two slices would reset the adapters' batch info)")
    if ext_config.sparse:
        # the sparse path takes EXTEND and MIXED batches; a sliced pass is SPLIT_PREFILL (sparse.EXTEND_MODES)
        found.append(
            f"{option_name('sparse')} (a sliced pass would run dense: the sparse path takes no split prefill)"
        )
    if found:
        raise OptionError(f"{flag} cannot be combined with: {'; '.join(found)}")


def validate_resolved_server_args(server_args: ServerArgs) -> None:
    """The same for what `ServerArgs.__post_init__` resolved (at its end, before any model loads): the
    attention backend SGLang picked when none was given (fa3 for MHA models on Hopper), the page size
    and chunked prefill size."""
    common.validate_attention_backend(server_args, ATTENTION_BACKENDS)
    validate_blend(server_args)


def validate_blend(server_args: ServerArgs) -> None:
    """Refuse --prefill-ext-blend where its plan could not run: a blended request's extends are SGLang's
    chunked prefill passes over one-token pages, on one pipeline stage, without a draft model. A page
    size or chunk size not resolved yet (None: not given) is checked once it is."""
    ext_config = common.prefill_ext_config(server_args)
    if ext_config is None or not ext_config.blend:
        return
    found = []
    page_size, chunk = server_args.page_size, server_args.chunked_prefill_size
    if page_size not in (None, 1):
        found.append(f"--page-size {page_size} (a placed chunk would continue a page)")
    if chunk is not None and chunk <= 0:
        found.append("chunked prefill off (--chunked-prefill-size: a blend plan's extends are its chunks)")
    if server_args.speculative_algorithm:
        found.append("--speculative-algorithm (a draft model's KV is not blended)")
    if server_args.pp_size > 1:
        found.append("--pp-size above 1")
    if server_args.enable_dp_attention:
        found.append("--enable-dp-attention")
    if found:
        raise OptionError(f"{option_name('blend')} cannot be served with: {'; '.join(found)}")


def build_tree_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    from sglang_prefill_ext.adapters.v0_5_17.tree_cache import build_tree_cache as build

    return build(ctx)


def create_attention_backend(runner: ModelRunner, name: str) -> AttentionBackend:
    """The non-MLA FlashInfer backend or the fa3 backend (`name`, one of ATTENTION_BACKENDS) under the
    flag: the extension's subclass if `--prefill-ext-sparse`, else SGLang's own."""
    if name == "fa3":
        from sglang_prefill_ext.adapters.v0_5_17.flashattention import create_backend
    else:
        from sglang_prefill_ext.adapters.v0_5_17.flashinfer import create_backend
    return create_backend(runner)


def wants_eager_prefill(runner: ModelRunner, forward_batch: ForwardBatch) -> bool:
    """True for batches the extension's backend must run without a captured prefill graph, and for a
    blended one-pass batch (its entries share a request's row)."""
    if not extension_enabled(runner.server_args):
        return False
    from sglang_prefill_ext.adapters.v0_5_17.blend_forward import expanded

    wants = getattr(runner.attn_backend, "wants_eager_prefill", None)
    return expanded(forward_batch) or (wants is not None and wants(forward_batch))


def forward(
    runner: ModelRunner, batch: ScheduleBatch | None, forward_batch: ForwardBatch, **kwargs: Any
) -> Any:
    """`tp_worker.forward_batch_generation`'s model forward: `runner.forward(forward_batch, **kwargs)`,
    or under --prefill-ext-blend the one-pass blended forward of `batch` (`blend_forward.forward`).
    The scheduler's extension is found through the batch's tree cache (None: the flag is off)."""
    glue = getattr(getattr(batch, "tree_cache", None), "prefill_ext_scheduler", None)
    blending = getattr(glue, "blending", None)
    if blending is None or not blending.one_pass:
        return runner.forward(forward_batch, **kwargs)
    from sglang_prefill_ext.adapters.v0_5_17.blend_forward import forward as blended

    return blended(blending, runner, batch, forward_batch, **kwargs)


def validate_input_ids(manager: TokenizerManager, input_ids: list[int] | None) -> None:
    """Under the flag, refuse token ids outside the vocabulary with a 400 before they reach the model.

    Stock 0.5.17 forwards them and its scheduler dies on the embedding lookup (measured on the H200:
    `bench/results/2026-11-29-h200-dense.md`, "Robustness"); SGLang's own check, `_validate_input_ids_in_vocab`,
    is never called there. Flag off: stock, unchanged."""
    if not input_ids or not extension_enabled(manager.server_args):
        return
    common.validate_token_ids(
        input_ids, manager.model_config.vocab_size, manager._validate_input_ids_in_vocab
    )


def chunk_spans_of_prompt(spans: Any, index: int) -> Any:
    """A batch's `chunk_spans` for its prompt `index` (`GenerateReqInput.__getitem__`): one entry per
    prompt. A value without that entry goes on whole, for the prompt's check to refuse under the flag
    (flag off, it is dropped as stock drops the field)."""
    if isinstance(spans, list) and index < len(spans):
        return spans[index]
    return spans


def chunk_spans(
    manager: TokenizerManager, obj: GenerateReqInput, input_ids: list[int] | None
) -> tuple[Span, ...] | None:
    """The request's checked chunk spans for its scheduler (`TokenizedGenerateReqInput.chunk_spans`)
    under `--prefill-ext-blend`: a malformed value is a ValueError (stock's 400). Flag off: None, the
    field dropped as stock drops an unknown field of `/generate`."""
    config = common.prefill_ext_config(manager.server_args)
    if config is None or not config.blend:
        return None
    return parse_chunk_spans(obj.chunk_spans, len(input_ids or ())) or None
