"""``search --precision amp`` plans the amp recipe (fp32 weights under autocast, foreach AdamW): more memory
per device than the default bf16 recipe for the same model, and an unknown recipe is refused by argparse."""

from __future__ import annotations

import json
from collections.abc import Callable

from cli_support import Result

ARGV = ("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--no-baseline", "--json")


def test_amp_is_a_recipe_the_user_picks(cli: Callable[..., Result]) -> None:
    bf16, amp = cli(*ARGV), cli(*ARGV, "--precision", "amp")
    assert bf16.code == 0 and amp.code == 0, (bf16.err, amp.err)
    memory = [json.loads(r.out)["memory_per_device"] for r in (bf16, amp)]
    assert memory[1] > memory[0]
    assert cli(*ARGV, "--precision", "fp8").code == 2
