"""Version-free parts of chunk blending (--prefill-ext-blend, docs/BLEND.md) beside the chunk store
(`radix.chunks`) and the re-positioning kernel (`ops.rerotate`): how a request marks its chunks."""
