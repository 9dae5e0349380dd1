"""The CPU harness for SGLang 0.5.17."""
