"""Versioned patches that hook the extension into an installed SGLang."""

from sglang_prefill_ext.patching.tree import PatchError, PatchSet, installed_sglang_dir, installed_version
from sglang_prefill_ext.versions import supported_versions

__all__ = ["PatchError", "PatchSet", "installed_sglang_dir", "installed_version", "supported_versions"]
