"""--prefill-ext-blend through the patched SGLang's own argument parsing: served with one-token pages and
chunked prefill, refused (one OptionError naming each reason) where a blend plan could not run."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from sglang_prefill_ext.config import OptionError
from tests.runner.conftest import ported

pytestmark = [pytest.mark.usefixtures("patched_sglang"), ported("blend")]
BLEND = ("--enable-prefill-ext", "--prefill-ext-blend")


def test_served_with_pages_of_one_and_chunked_prefill(sglang_harness: ModuleType) -> None:
    args = sglang_harness.parse_server_args(*BLEND, "--page-size", "1", "--chunked-prefill-size", "512")
    assert args.prefill_ext_options == {"blend": True}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--page-size", "16"), "--page-size 16 (a placed chunk would continue a page)"),
        (("--chunked-prefill-size", "-1"), "chunked prefill off"),
        (("--pp-size", "2"), "--pp-size above 1"),
        (("--speculative-algorithm", "EAGLE"), "--speculative-algorithm"),
    ],
)
def test_what_it_cannot_be_served_with_refused(
    sglang_harness: ModuleType, argv: tuple[str, ...], named: str
) -> None:
    with pytest.raises(OptionError, match="^--prefill-ext-blend cannot be served with: " + re.escape(named)):
        sglang_harness.parse_server_args(*BLEND, *argv)
