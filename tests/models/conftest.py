"""scripts/models/model_parts.py, imported as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "models" / "model_parts.py"


@pytest.fixture(scope="session")
def model_parts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_parts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
