"""LLaMA-3 at full size on the meta device: the 2-block path (8B) and the full export (70B).

The 70B capture runs in a fresh interpreter so its time and peak RSS are its own (printed with ``-s``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoshard import zoo
from autoshard.capture import META_BLOCK, capture

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_llama3_8b_two_block_capture() -> None:
    case = zoo.build("llama3-8b")
    cap = capture(case.model, case.args, case.kwargs)
    print(f"\nllama3-8b 2-block capture: {cap.seconds:.2f} s, {len(cap.graph_module.graph.nodes)} nodes")
    info = cap.blocks
    assert info is not None
    assert (info.prefix, info.num_blocks, info.captured_blocks, info.block_type) == (
        "model.layers",
        32,
        2,
        "LlamaDecoderLayer",
    )
    assert len(case.model.model.layers) == 32  # restored after the cut
    assert sum(m.numel for m in cap.all_params().values()) == sum(p.numel() for p in case.model.parameters())
    assert {n.meta[META_BLOCK][0] for n in cap.nodes() if META_BLOCK in n.meta} == {0, 1}
    assert info.block_params["self_attn.k_proj.weight"].shape == (1024, 4096)  # 8 kv heads x 128
    assert info.block_params["mlp.down_proj.weight"].shape == (4096, 14336)
    # forward FLOPs are dominated by 2 * params * tokens; attention adds 4 * B * S^2 * h per layer
    tokens = 8 * 4096
    dense = 2 * tokens * (sum(p.numel() for p in case.model.parameters()) - 128256 * 4096)
    attention = 32 * 4 * 8 * 4096 * 4096 * 4096
    assert cap.total_flops() == pytest.approx(dense + attention, rel=0.01)


_SCRIPT = textwrap.dedent(
    """
    import json, resource, time
    from autoshard import zoo
    from autoshard.capture import capture
    case = zoo.build("llama3-70b")
    start = time.perf_counter()
    cap = capture(case.model, case.args, blocks="full")
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "rss": rss, "nodes": len(cap.graph_module.graph.nodes),
                      "per_block": cap.blocks.nodes_per_block, "blocks": cap.blocks.captured_blocks}))
    """
)


@pytest.mark.slow
def test_llama3_70b_full_export_on_meta() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=300, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"\nllama3-70b full capture: {result['seconds']:.1f} s, peak RSS {result['rss'] / 2**20:.0f} MiB, "
        f"{result['nodes']} nodes"
    )
    assert result["blocks"] == 80
    # the raw export has ~5,900 nodes; cleaning drops 4 asserts per layer and a few more outside the layers
    assert 5_300 <= result["nodes"] <= 6_000
    assert result["rss"] < 1.0 * 2**30
