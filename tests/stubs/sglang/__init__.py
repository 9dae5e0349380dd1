"""A stand-in for SGLang's package in bench/gpu scripts' CPU tests: only `python -m sglang.launch_server`."""
