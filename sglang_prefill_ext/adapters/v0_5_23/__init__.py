"""Adapter for SGLang 0.5.23."""
