"""Version-free sparse prefill ops: block layout, block selection (pooled Q/K, sampled rows), FlashInfer plan and run."""

from .attention import BlockSparsePrefill
from .layout import BlockLayout, context_locs
from .settings import SparseSettings
from .sparse_prefill import SparsePrefill
from .summaries import KeySummaryCache

__all__ = [
    "BlockLayout",
    "BlockSparsePrefill",
    "KeySummaryCache",
    "SparsePrefill",
    "SparseSettings",
    "context_locs",
]
