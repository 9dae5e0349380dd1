"""`sglang-prefill-ext {apply,revert,check,status}`: manage the patches on an installed SGLang."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_prefill_ext.patching import PatchError, PatchSet, installed_sglang_dir


def _run(verb: str, patches: PatchSet) -> str:
    if verb == "status":
        return f"SGLang {patches.version} in {patches.sglang_dir}: {patches.status()}"
    if verb == "check":
        if patches.status() == "applied":
            return f"check: already applied; revert would change {len(patches.check(forward=False))} files"
        files = patches.check(forward=True)
        return "check: apply would change:\n  " + "\n  ".join(files)
    changed = patches.apply() if verb == "apply" else patches.revert()
    if not changed:
        return f"{verb}: nothing to do (already {'applied' if verb == 'apply' else 'reverted'})"
    return f"{verb}: changed {len(changed)} files:\n  " + "\n  ".join(changed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-prefill-ext", description=__doc__)
    parser.add_argument("verb", choices=["apply", "revert", "check", "status"])
    parser.add_argument("--sglang-version", required=True, help="the SGLang version the patches are for")
    parser.add_argument(
        "--sglang-dir",
        type=Path,
        default=None,
        help="folder holding the sglang/ package (default: the one this Python imports)",
    )
    args = parser.parse_args(argv)
    try:
        sglang_dir = args.sglang_dir or installed_sglang_dir()
        print(_run(args.verb, PatchSet(args.sglang_version, sglang_dir)))
    except PatchError as e:
        print(f"sglang-prefill-ext {args.verb}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
