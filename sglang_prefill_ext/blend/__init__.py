"""Version-free parts of chunk blending (--prefill-ext-blend, docs/BLEND.md) beside the chunk store
(`radix.chunks`), the re-positioning kernel (`ops.rerotate`) and blended attention
(`ops.blend_attention`): how a request marks its chunks (`spans`), which chunk tokens are recomputed
(`select`), and the reference blended prefill over a transformers model (`prefill`)."""
