"""A stand-in for vLLM, only so that SGLang 0.5.17 imports on a CPU without its CPU engine (see
tests/runner/engine_driver.py)."""
