"""Per-version adapters: the only code (with patches/) that touches SGLang's internals."""
