"""The TTFT harness over HTTP and the checks that drive a running SGLang server."""
