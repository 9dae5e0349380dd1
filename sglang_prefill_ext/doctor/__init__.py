"""The cache doctor (`sglang-prefill-ext doctor`): why prompts miss the prefix cache, read from the
request log's prompt fingerprints (`fingerprint`), and what a change to the prompt layout would save.
Version-free: no SGLang imports."""
