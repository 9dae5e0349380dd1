"""`sglang-prefill-ext {apply,revert,check,status}`: manage the patches on an installed SGLang.

By default the SGLang this Python imports, at its installed version. Exit codes: 0 done (or
nothing to do; `status`: applied or not applied); 1 `status` found a partially applied or foreign
(hand-changed, missing) file; 2 refused (unsupported or mismatched version, no SGLang, a foreign
change): nothing was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_prefill_ext.patching import PatchError, PatchSet, installed_sglang_dir, installed_version

EXIT_ATTENTION = 1
EXIT_REFUSED = 2


def _run(verb: str, patches: PatchSet) -> tuple[int, str]:
    if verb == "status":
        status = patches.status()
        code = 0 if status in ("applied", "not applied") else EXIT_ATTENTION
        return code, f"SGLang {patches.version} in {patches.sglang_dir}: {status}"
    if verb == "check":
        if patches.status() == "applied":
            return 0, f"check: already applied; revert would change {len(patches.check(forward=False))} files"
        return 0, "check: apply would change:\n  " + "\n  ".join(patches.check(forward=True))
    changed = patches.apply() if verb == "apply" else patches.revert()
    if not changed:
        return 0, f"{verb}: nothing to do (already {'applied' if verb == 'apply' else 'reverted'})"
    return 0, f"{verb}: changed {len(changed)} files:\n  " + "\n  ".join(changed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sglang-prefill-ext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("verb", choices=["apply", "revert", "check", "status"])
    parser.add_argument(
        "--sglang-version",
        default=None,
        help="refuse unless the SGLang found is this version (default: whichever is installed)",
    )
    parser.add_argument(
        "--sglang-dir",
        type=Path,
        default=None,
        help="folder holding the sglang/ package (default: the one this Python imports)",
    )
    args = parser.parse_args(argv)
    try:
        sglang_dir = args.sglang_dir or installed_sglang_dir()
        version = args.sglang_version or installed_version(sglang_dir)
        code, message = _run(args.verb, PatchSet(version, sglang_dir))
    except PatchError as e:
        print(f"sglang-prefill-ext {args.verb}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
