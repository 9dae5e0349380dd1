"""README's flag table and `--help` (the options dataclass) name the same flags with the same defaults."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from sglang_prefill_ext.config import PrefillExtConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_defaults() -> dict[str, str]:
    """Flag -> the default cell of its row in README's `## Flags` table; a row listing several flags
    (`a` / `b`) gives each its own part of an `x / y` default."""
    section = README.read_text(encoding="utf-8").split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    found: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        flags = re.findall(r"`(--[a-z-]+)`", cells[0]) if len(cells) >= 3 else []
        defaults = cells[1].split(" / ") if len(flags) > 1 else [cells[1]] if flags else []
        found.update(zip(flags, defaults, strict=True))
    return found


def shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float):
        return f"{default:g}"
    return "off" if default == "" else str(default)


def same_value(readme: str, default: str) -> bool:
    """Equal as written, or as numbers (README may write 1.0 where --help shows 1)."""
    try:
        return readme == default or float(readme) == float(default)
    except ValueError:
        return False


def test_every_option_is_in_the_readme_with_its_default() -> None:
    documented = readme_defaults()
    for field in dataclasses.fields(PrefillExtConfig):
        flag = f"--prefill-ext-{field.name.replace('_', '-')}"
        assert flag in documented, f"{flag} is not in README's flag table"
        assert same_value(documented[flag].split(" (")[0].strip("`"), shown(field.default)), (
            flag,
            documented[flag],
        )
    extra = set(documented) - {
        f"--prefill-ext-{f.name.replace('_', '-')}" for f in dataclasses.fields(PrefillExtConfig)
    }
    assert extra == {"--enable-prefill-ext"}, extra
