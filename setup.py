"""The one build setting pyproject.toml cannot express: the wheel ships the repository's top-level
`patches/` as the package data `sglang_prefill_ext/patches/` (sglang_prefill_ext/versions.py finds
either). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["sglang_prefill_ext*"]), "sglang_prefill_ext.patches"],
    package_dir={"sglang_prefill_ext.patches": "patches"},
    package_data={"sglang_prefill_ext.patches": ["sglang-*/*.patch"]},
)
