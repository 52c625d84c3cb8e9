"""Under the amp recipe a moved tensor carries its producer's autocast dtype
(:func:`autoshard.problem.autocast.moved_itemsize`): a tiny LLaMA captured in fp32, as amp users keep it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest
import torch
import transformers

import autoshard
from autoshard.capture import capture
from autoshard.capture.meta import TensorMeta
from autoshard.codegen.assign import assign_strategies
from autoshard.codegen.lower import lower_graph
from autoshard.placement import Replicate, ShardingSpec
from autoshard.plans import Collective, Plan
from autoshard.problem.autocast import moved_itemsize
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions, edge_steps
from autoshard.problem.graph import NodeInfo, describe
from autoshard.runtime.verify import cluster_for
from cost_models.memory import AMP_BF16


def _llama() -> tuple[torch.nn.Module, torch.Tensor]:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=127,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return model, torch.zeros(2, 32, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, torch.Tensor]:
    return _llama()


def test_a_move_carries_its_producers_amp_dtype(llama: tuple[torch.nn.Module, torch.Tensor]) -> None:
    model, ids = llama
    infos = describe(capture(model, (ids,), {}).graph_module)
    linear = next(n for n in infos if n.op == "linear" and n.module.endswith("o_proj"))
    residual = next(n for n in infos if n.op == "add" and _meta(n).numel == _meta(linear).numel)
    weight = next(n for n in infos if n.kind == "parameter" and "o_proj" in n.fqn)
    gated = next(n for n in infos if n.op == "mul" and n.module.endswith("mlp"))
    for info in (linear, residual, weight):
        assert _meta(info).itemsize == 4 and moved_itemsize(info, 0, None) == 4  # plain fp32
    assert moved_itemsize(linear, 0, AMP_BF16) == 2  # autocast's product: bf16
    assert moved_itemsize(residual, 0, AMP_BF16) == 4  # the residual stream stays fp32
    # fp32 weights, gathered in bf16 (FSDP2's MixedPrecisionPolicy(param_dtype=bf16)), gradients reduced in fp32
    assert moved_itemsize(weight, 0, AMP_BF16) == 2
    assert moved_itemsize(weight, 0, AMP_BF16, gradient=True) == 4
    assert moved_itemsize(gated, 0, AMP_BF16) == 2  # silu(gate) * up: both 16-bit products


def _by_move(collectives: Iterable[Collective]) -> dict[tuple, int]:
    return {(c.kind, c.phase, c.node, c.tensor, c.layer): c.nbytes for c in collectives}


MEGATRON = {"*.o_proj": "row", "*.down_proj": "row", "*.q_proj": "column", "*.k_proj": "column",
            "*.v_proj": "column", "*.gate_proj": "column", "*.up_proj": "column"}  # fmt: skip


def _plan(llama: tuple[torch.nn.Module, torch.Tensor], allow: str, precision: str) -> Plan:
    model, ids = llama
    # a tiny model is too small for parallelism to pay: pin Megatron's TP, or a batch split
    pins = MEGATRON if allow == "tp" else {"input_ids": ("S(0)",)}
    return autoshard.plan(
        model, cluster_for("h100x8", 2), (ids,), allow=(allow,), annotations=pins, recompute="none",
        memory_limit=float("inf"), precision=precision,  # type: ignore[arg-type]
    )  # fmt: skip


def test_tp_all_reduce_after_an_autocast_product_moves_bf16(
    llama: tuple[torch.nn.Module, torch.Tensor],
) -> None:
    fp32, amp = _plan(llama, "tp", "bf16"), _plan(llama, "tp", "amp")
    infos = {n.name: n for n in describe(capture(*_with_args(llama)).graph_module)}
    plain, mixed = _by_move(fp32.collectives), _by_move(amp.collectives)
    products = [k for k in plain if k[0] == "all_reduce" and k[1] == "forward" and infos[k[3]].op == "linear"]
    assert products  # row-parallel o_proj / down_proj outputs reduced before the residual add
    for key in products:
        assert key in mixed and mixed[key] * 2 == plain[key]  # 2 bytes per element under amp, 4 in fp32
    assert amp.precision == "amp"


def test_gradient_sync_moves_the_parameter_dtype_of_the_recipe() -> None:
    """A model captured in bf16 (as the planner's 70B/8B runs): its bf16 recipe syncs 2-byte gradients, amp's
    fp32 weights sync 4-byte ones; the same edge, the same strategies."""
    model, ids = _llama()
    model = model.to(torch.bfloat16)
    captured = capture(model, (ids,), {})
    built = build_problem(captured, cluster_for("h100x8", 2), CostOptions())
    weight = next(i for i in built.infos.values() if i.kind == "parameter" and "0.self_attn.o_proj" in i.fqn)
    linear = next(i for i in built.infos.values() if i.op == "linear" and weight.name in i.inputs)
    have = next(s for s in built.strategies[weight.name] if _replicated(s.outputs[0]))
    use = next(s for s in built.strategies[linear.name] if _partial(s.input_grads[1]))
    sizes = {}
    for name, policy in (("bf16", None), ("amp", AMP_BF16)):
        steps = edge_steps(weight, 0, have, use, 1, CostOptions(precision=policy), built.cache)
        (sync,) = [s for s in steps.backward if s.kind == "all_reduce"]
        sizes[name] = sync.nbytes
    numel = _meta(weight).numel
    assert sizes == {"bf16": numel * 2, "amp": numel * 4}


def _replicated(spec: ShardingSpec | None) -> bool:
    return spec is not None and all(p == Replicate() for p in spec.placements)


def _partial(spec: ShardingSpec | None) -> bool:
    return spec is not None and bool(spec.partial_axes())


def _meta(info: NodeInfo) -> TensorMeta:
    meta = info.outputs[0]
    assert meta is not None
    return meta


def _with_args(llama: tuple[torch.nn.Module, torch.Tensor]) -> tuple[torch.nn.Module, tuple, dict]:
    model, ids = llama
    return model, (ids,), {}


def test_the_emitted_program_sizes_its_collectives_as_the_amp_plan(
    llama: tuple[torch.nn.Module, torch.Tensor],
) -> None:
    """The lowering prices each step with the plan's options (``parallelize`` passes the plan's recipe), so the
    emitted collectives are the plan's, bytes included; at run time a collective moves the tensor autocast
    made (verify and train run no autocast: there the product outputs still move fp32)."""
    plan = _plan(llama, "tp", "amp")
    captured = capture(*_with_args(llama))
    strategies = assign_strategies(captured, plan)
    cluster = cluster_for("h100x8", 2)

    def emitted(opts: CostOptions) -> Counter[tuple]:
        lowered = lower_graph(captured, strategies, cluster, (0,), opts=opts)
        return Counter(
            (p, str(s.kind), s.mesh_axis, s.nbytes) for e in lowered.edges for p, s in e.collectives()
        )

    planned = Counter(
        (c.phase, c.kind, c.mesh_axis, c.nbytes) for c in plan.collectives if c.phase != "regather"
    )
    assert emitted(CostOptions(precision=AMP_BF16)) == planned
    assert emitted(CostOptions()) != planned  # lowered without the recipe: fp32 product outputs
