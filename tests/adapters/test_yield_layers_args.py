"""--prefill-ext-yield-layers through the patched SGLang's own argument parsing: served with the normal
event loop, refused (one OptionError naming the reason) where its sliced pass could not run."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from sglang_prefill_ext.config import OptionError
from tests.runner.conftest import ported

pytestmark = [pytest.mark.usefixtures("patched_sglang"), ported("yield_layers")]
YIELD = ("--enable-prefill-ext", "--prefill-ext-yield-layers", "4")
NORMAL_LOOP = "--disable-overlap-schedule"


def test_served_with_the_normal_event_loop(sglang_harness: ModuleType) -> None:
    args = sglang_harness.parse_server_args(*YIELD, NORMAL_LOOP)
    assert args.prefill_ext_options == {"yield_layers": 4}


def test_the_overlap_loop_refused(sglang_harness: ModuleType) -> None:
    with pytest.raises(OptionError, match="^--prefill-ext-yield-layers needs --disable-overlap-schedule "):
        sglang_harness.parse_server_args(*YIELD)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--enable-pdmux",), "--enable-pdmux"),
        (("--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"), "--enable-dp-attention"),
        (("--enable-two-batch-overlap",), "--enable-two-batch-overlap"),
        (("--pp-size", "2"), "--pp-size above 1"),
        (("--speculative-algorithm", "EAGLE"), "--speculative-algorithm"),
        (("--enable-lora",), "LoRA adapters"),
        (("--lora-paths", "adapter=/nowhere"), "LoRA adapters"),
        (("--prefill-ext-sparse",), "--prefill-ext-sparse"),
    ],
)
def test_what_it_cannot_combine_with_refused(
    sglang_harness: ModuleType, argv: tuple[str, ...], named: str
) -> None:
    with pytest.raises(
        OptionError, match="^--prefill-ext-yield-layers cannot be combined with: " + re.escape(named)
    ):
        sglang_harness.parse_server_args(*YIELD, NORMAL_LOOP, *argv)


def test_off_by_default(sglang_harness: ModuleType) -> None:
    from sglang_prefill_ext.config import PrefillExtConfig

    assert PrefillExtConfig().yield_layers == 0
    assert sglang_harness.parse_server_args("--enable-prefill-ext", NORMAL_LOOP).prefill_ext_options is None
