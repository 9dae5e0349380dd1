"""The sparse policy: one extend batch's sparse attention, layer by layer — select blocks, plan, run.

`begin` takes the batch's block layout and KV slots once per forward. `attend` of a layer is the policy
the server and the accuracy bench both run: the first `settings.dense_layers` run dense (None); a sparse
layer scores its queries against the context's keys (antidiagonal sums, sampled rows and/or pooled blocks:
scorers/), selects the kept blocks (per query head, or per KV head without `settings.per_query_head`),
plans FlashInfer and runs; without `settings.per_layer` a later layer reuses the plan and only runs the
attention (one selection and one plan per forward). A first selection keeping more than
`settings.max_density` of its causal blocks declines the forward (None: the caller's dense attention runs
from that layer on), and so does one whose sampled rows find too little of their exact attention in the
kept blocks (`settings.guard`, at the first sparse layer and every `settings.guard_every`-th after it:
guard.py).
"""

from __future__ import annotations

import torch

from .attention import BlockSparseAttention
from .guard import kept_share, low_quantile
from .layout import BlockLayout
from .plan import build_plan_indices, device_plan_indices
from .scorers.antidiagonal import Packing, antidiagonal_mass
from .scorers.pooled import key_segments, pool_keys, pool_queries, select_pooled
from .scorers.sampled import SampleGeometry, block_mass, row_mass, sample_geometry
from .selection import select_by_mass
from .settings import SparseSettings


class SparsePrefill:
    def __init__(self, settings: SparseSettings, attention: BlockSparseAttention) -> None:
        self.settings = settings
        self.attention = attention
        self._layout: BlockLayout | None = None
        self._locs = torch.empty(0, dtype=torch.int64)
        self._geometry: SampleGeometry | None = None  # the sampled scorer's, per layout
        self._packings: dict[int, Packing] = {}  # the antidiagonal scorer's, per layout and stride
        self.planned = False
        self.mask: torch.Tensor | None = None
        self._indices: torch.Tensor | None = None  # with settings.plan_once: later layers' kv_indices
        self.guard_stats: dict[int, float] = {}  # this forward's guard statistic per checked sparse layer
        self.declined = False  # this forward runs dense from the layer that declined it

    @classmethod
    def create(cls, settings: SparseSettings, workspace: torch.Tensor) -> SparsePrefill:
        """Over FlashInfer with `workspace`, on the kernel it picks (fa3 on Hopper)."""
        return cls(settings, BlockSparseAttention(workspace))

    def begin(self, layout: BlockLayout, locs: torch.Tensor) -> None:
        """Start a forward over `layout`, whose context positions live in KV slots `locs`."""
        self._layout = layout
        self._locs = locs
        self._geometry = None
        self._packings = {}
        self.planned = False
        self.mask = None
        self._indices = None
        self.guard_stats = {}
        self.declined = False

    @property
    def layout(self) -> BlockLayout:
        assert self._layout is not None, "begin() first"
        return self._layout

    def select(
        self, q: torch.Tensor, k_buffer: torch.Tensor, sm_scale: float, layer: int | None = None
    ) -> torch.Tensor:
        """Kept blocks [Hkv, R, C] from model layer `layer`'s queries [N, Hq, D] and KV pool keys, at that
        layer's mass and stride (`SparseSettings.at_layer`)."""
        layout = self.layout
        settings = self.settings.at_layer(layer)
        scorer = settings.scorer
        if scorer == "antidiagonal":
            stride = settings.stride
            packing = self._packing(q, k_buffer, stride)
            mass = antidiagonal_mass(
                q, k_buffer, self._locs, layout, stride, sm_scale, settings.per_query_head, packing
            )
            return select_by_mass(mass, layout, settings)
        by_mass = None
        if scorer in ("sampled", "hybrid"):
            mass = block_mass(
                q,
                k_buffer,
                self._locs,
                layout,
                settings.samples,
                sm_scale,
                self._sample_geometry(q, k_buffer),
                per_query_head=settings.per_query_head,
            )
            by_mass = select_by_mass(mass, layout, settings)
            if scorer == "sampled":
                return by_mass
        by_pool = self._select_pooled(q, k_buffer, sm_scale)
        return by_pool if by_mass is None else by_pool | by_mass

    def _packing(self, q: torch.Tensor, k_buffer: torch.Tensor, stride: int) -> Packing:
        """The antidiagonal scorer's packing at `stride`, built once per layout and stride (a layer's stride:
        `SparseSettings.layer_stride`)."""
        if stride not in self._packings:
            self._packings[stride] = Packing.build(
                self.layout, self._locs, q.shape[1], k_buffer.shape[1], stride
            )
        return self._packings[stride]

    def _sample_geometry(self, q: torch.Tensor, k_buffer: torch.Tensor) -> SampleGeometry:
        """The sampled rows' kernel geometry (scorer and guard alike), built once per layout."""
        if self._geometry is None:
            group = q.shape[1] // k_buffer.shape[1]
            self._geometry = sample_geometry(self.layout, self.settings.samples, group)
        return self._geometry

    def guard_checks(self, layer: int) -> bool:
        """Whether the guard checks the forward's sparse layer `layer` (0: the first)."""
        every = self.settings.guard_every
        return self.settings.guard > 0 and (layer == 0 or (every > 0 and layer % every == 0))

    def guard_passes(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        sm_scale: float,
        layer: int,
    ) -> bool:
        """Whether the sampled rows of this layer's queries [N, Hq, D] find at least `settings.guard` of their
        exact attention in the blocks of `mask` (the layer's selection), at guard.py's low quantile; the
        statistic lands in `guard_stats[layer]` (reads back to the host)."""
        assert self.mask is not None, "select first"
        mass = row_mass(
            q,
            k_buffer,
            self._locs,
            self.layout,
            self.settings.samples,
            sm_scale,
            self._sample_geometry(q, k_buffer),
        )
        self.guard_stats[layer] = low_quantile(kept_share(mass, self.mask))
        return self.guard_stats[layer] >= self.settings.guard

    @property
    def guard_stat(self) -> float | None:
        """The guard statistic of this forward's last checked layer (None: none checked)."""
        return next(reversed(self.guard_stats.values()), None)

    def _select_pooled(self, q: torch.Tensor, k_buffer: torch.Tensor, sm_scale: float) -> torch.Tensor:
        layout = self.layout
        kpool = pool_keys(k_buffer, key_segments(layout, self._locs))
        return select_pooled(pool_queries(q, layout), kpool, layout, self.settings, sm_scale)

    def plan(
        self,
        mask: torch.Tensor,
        q: torch.Tensor,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
        num_kv_heads: int | None = None,
    ) -> None:
        """Plan `mask` [Hm, R, C] (Hm: the pool's `num_kv_heads`, the default, or the query heads). With
        `settings.plan_once`, a later layer of the forward the plan serves (`BlockSparseAttention.serves`) keeps it and
        swaps in its own indices, built on the device (where FlashInfer planned it directly: another
        FlashInfer version plans every layer)."""
        num_mask_heads = mask.shape[0]
        once = self.settings.plan_once
        problem = (q.shape[1], num_mask_heads, q.shape[2], q.dtype, sm_scale, logits_soft_cap)
        if once and self.planned and self.attention.serves(problem):
            kv_indptr, self._indices = device_plan_indices(
                mask, self.layout, self._locs, num_kv_heads, self._indices
            )
            self.attention.use_indices(kv_indptr, self._indices)
        else:
            indices = build_plan_indices(mask, self.layout, self._locs, num_kv_heads)
            self.attention.plan(indices, *problem, reusable=once)
        self.mask = mask
        self.planned = True

    def head_densities(self, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per mask head (KV or query head), kept key blocks of `mask` (default: the last selection's) over the
        causally allowed ones: [Hm] fp32."""
        mask = self.mask if mask is None else mask
        assert mask is not None, "plan() first"
        return mask.sum((1, 2)) / (self.layout.row_block.long() + 1).sum()

    def density(self, mask: torch.Tensor | None = None) -> float:
        """The mean of `head_densities` (reads back to the host)."""
        return float(self.head_densities(mask).mean())

    def select_and_plan(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        sm_scale: float,
        logits_soft_cap: float = 0.0,
        max_density: float = 1.0,
        guard_layer: int | None = None,
        layer: int | None = None,
    ) -> bool:
        """Select model layer `layer`'s blocks and plan them. With `max_density` < 1, a mask keeping more
        than that fraction of its causal blocks is declined: nothing is planned, False is returned; so is
        one that fails the guard (`guard_passes`) as sparse layer `guard_layer` (None: not checked)."""
        self.mask = self.select(q, k_buffer, sm_scale, layer)
        if max_density < 1.0 and self.density() > max_density:
            return False
        if guard_layer is not None and not self.guard_passes(q, k_buffer, sm_scale, guard_layer):
            return False
        self.plan(self.mask, q, sm_scale, logits_soft_cap, num_kv_heads=k_buffer.shape[1])
        return True

    def takes(self, layer: int) -> bool:
        """Whether layer `layer` (from the model's first, 0) of this forward runs sparse: past the
        `settings.dense_layers` and the forward not declined."""
        return layer >= self.settings.dense_layers and not self.declined

    def sparse_index(self, layer: int) -> int:
        """Layer `layer`'s index among the forward's sparse layers (0: the first; `guard_stats`' keys)."""
        return layer - self.settings.dense_layers

    def selects(self) -> bool:
        """Whether the next sparse layer selects and plans its own blocks: every one with
        `settings.per_layer`, else the forward's first."""
        return self.settings.per_layer or not self.planned

    def attend(
        self,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        v_buffer: torch.Tensor,
        sm_scale: float,
        layer: int,
        logits_soft_cap: float = 0.0,
    ) -> torch.Tensor | None:
        """Attention of layer `layer`'s q [N, Hq, D] (`layer` from the model's first, 0) over the batch's
        context in the KV pool, [N, Hq, D]; None where the caller's dense attention runs: a dense layer
        (`takes`), or a declined forward, from the layer that declines it on. The first sparse layer declines
        it when its selection keeps more than `settings.max_density` of its causal blocks; it and every layer
        the guard checks (`guard_checks`) when the guard fails."""
        if not self.takes(layer):
            return None
        index = self.sparse_index(layer)
        guard_layer = index if self.guard_checks(index) else None
        if self.selects():
            max_density = self.settings.max_density if index == 0 else 1.0
            sparse = self.select_and_plan(
                q, k_buffer, sm_scale, logits_soft_cap, max_density, guard_layer, layer
            )
        else:
            sparse = guard_layer is None or self.guard_passes(q, k_buffer, sm_scale, guard_layer)
        if not sparse:
            self.declined = True
            return None
        return self.run(q, k_buffer, v_buffer)

    def run(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> torch.Tensor:
        """The planned attention of q [N, Hq, D] over the kept blocks."""
        return self.attention.run(q, k_buffer, v_buffer)
