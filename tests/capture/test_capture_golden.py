"""Captures of small LLaMA and GPT-2 models are the same, node for node and flag for flag, as those recorded in
``capture_golden.json`` before capture was made faster for LLaMA-3-70B (issue 17): the compact evaluation of
the causal-mask proof and the cheaper export must change no node, shape, ``META_*`` key, block, run or note.

The cases cover every path of the mask proof (a mask small enough to evaluate whole, a batch of 72 position
rows, the symbolic square) and the 2-block shortcut with its 3-block check (4 layers).

After a deliberate change of what capture produces (or a torch / transformers upgrade that renames nodes),
regenerate the record and review its diff: ``python -m tests.capture.test_capture_golden``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from autoshard import zoo
from autoshard.capture import Captured, capture

GOLDEN = Path(__file__).with_name("capture_golden.json")

CASES: dict[str, tuple[str, int, int, int]] = {
    # name: (zoo model, batch, seq, layers)
    "llama-evaluated": ("llama-tiny", 2, 32, 4),
    "llama-batched": ("llama-tiny", 72, 128, 4),
    "llama-symbolic": ("llama-tiny", 2, 512, 4),
    "gpt2-symbolic": ("gpt2-tiny", 2, 64, 4),
}


def _arg(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (tuple, list)):
        return [_arg(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _arg(v) for k, v in a.items()}
    return repr(a)


def _meta(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_meta(v) for v in value]
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def fingerprint(cap: Captured) -> dict[str, Any]:
    """Everything capture decides, as JSON: per node its name and a digest of its op, arguments and every
    ``autoshard_*`` meta key; the record's fields.  Stack traces are left out (they hold this machine's paths)."""
    nodes = []
    for n in cap.nodes():
        keys = sorted(k for k in n.meta if k.startswith("autoshard_"))
        meta = {k.removeprefix("autoshard_"): _meta(n.meta[k]) for k in keys}
        line = json.dumps([n.op, str(n.target), _arg(n.args), _arg(n.kwargs), meta], sort_keys=True)
        nodes.append(f"{n.name} {hashlib.sha256(line.encode()).hexdigest()[:16]}")
    return {
        "nodes": nodes,
        "blocks": repr(cap.blocks),
        "runs": [repr(r) for r in cap.runs],
        "notes": list(cap.notes),
        "user_inputs": list(cap.user_inputs),
        "outputs": [repr(o) for o in cap.outputs],
        "params": {k: str(v) for k, v in cap.params.items()},
        "buffers": {k: str(v) for k, v in cap.buffers.items()},
        "constants": {k: [str(v.dtype), list(v.shape)] for k, v in cap.constants.items()},
        "method": cap.method,
    }


def _capture(case: str) -> Captured:
    model, batch, seq, layers = CASES[case]
    built = zoo.build(model, batch=batch, seq=seq, layers=layers, device="meta")
    return capture(built.model, built.args, built.kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_capture_matches_the_recorded_one(case: str) -> None:
    expected = json.loads(GOLDEN.read_text())[case]
    got = fingerprint(_capture(case))
    assert got["nodes"] == expected["nodes"]
    assert got == expected


def main() -> None:
    torch.manual_seed(0)
    record = {case: fingerprint(_capture(case)) for case in CASES}
    GOLDEN.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({sum(len(r['nodes']) for r in record.values())} nodes)")


if __name__ == "__main__":
    main()
