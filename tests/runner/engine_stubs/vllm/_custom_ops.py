"""SGLang's `RotaryEmbedding` imports vLLM's rotary kernel as its fallback off CUDA; the CPU tests'
models never call it (SGLang's native rotary runs there)."""


def rotary_embedding(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("vLLM's rotary kernel is not available in the CPU tests")
