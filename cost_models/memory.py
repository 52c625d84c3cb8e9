"""Bytes per device: sharded tensors, and the training state of a parameter set under ZeRO stages 0–3.

Input: shapes or element counts, dtypes or item sizes, shard counts; for training state, the parameter count
Ψ, a :class:`StateRecipe` (bytes per parameter of weights, gradients and optimizer state) and the ZeRO stage
over N_d data-parallel ranks.
Output: bytes (ints for tensors, floats for the averaged training state).

ZeRO (Rajbhandari et al., SC'20) shards more of the state over the N_d data-parallel ranks at each stage:

=====  ==========================  ===============================
stage  sharded over N_d            mixed-precision Adam, bytes
=====  ==========================  ===============================
0      nothing                     2Ψ + 2Ψ + 12Ψ = 16Ψ
1      optimizer state             4Ψ + 12Ψ/N_d
2      + gradients                 2Ψ + 14Ψ/N_d
3      + weights (FSDP)            16Ψ/N_d
=====  ==========================  ===============================

Example (REFERENCE.md, Ψ = 7.5e9, N_d = 64; decimal GB)::

    >>> [training_state_bytes(7.5e9, MIXED_PRECISION_ADAM, s, 64).total / 1e9 for s in range(4)]
    [120.0, 31.40625, 16.640625, 1.875]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.profile import canonical_dtype

__all__ = [
    "AMP_BF16",
    "FOREACH_ADAMW_BYTES",
    "FP32_ADAM",
    "ITEMSIZE",
    "MIXED_PRECISION_ADAM",
    "RECIPES",
    "PrecisionPolicy",
    "StateBytes",
    "StateRecipe",
    "gathered_weight_bytes",
    "itemsize",
    "local_shard_bytes",
    "logits_bytes",
    "microbatches_in_flight",
    "sharded_bytes",
    "training_state_bytes",
    "transformer_activation_bytes",
]

ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2, "float8": 1,
    "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


def itemsize(dtype: object) -> int:
    """Bytes per element of ``dtype`` (a name such as ``"bf16"`` or a ``torch.dtype``)."""
    name = canonical_dtype(dtype)
    try:
        return ITEMSIZE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {sorted(ITEMSIZE)}") from None


def sharded_bytes(numel: float, itemsize: int, shards: int = 1) -> float:
    """Average bytes per device of a tensor split into ``shards`` equal parts: numel · itemsize / shards."""
    if numel < 0 or itemsize < 1 or shards < 1:
        raise ValueError(
            f"sharded_bytes needs numel >= 0, itemsize >= 1, shards >= 1; got {numel}, {itemsize}, {shards}"
        )
    return numel * itemsize / shards


def local_shard_bytes(
    shape: Sequence[int], itemsize: int, shards_per_dim: Sequence[int] | None = None
) -> int:
    """Bytes of the largest local shard when dim ``d`` is split into ``shards_per_dim[d]`` chunks.

    Chunks follow ``torch.chunk`` (as DTensor does): the first chunks hold ceil(size / shards) elements, so an
    uneven split is priced by its largest piece, the one that sets the memory peak.
    """
    shards = tuple(shards_per_dim) if shards_per_dim is not None else (1,) * len(shape)
    if len(shards) != len(shape):
        raise ValueError(f"shards_per_dim {shards} needs one entry per dim of shape {tuple(shape)}")
    if any(s < 1 for s in shards) or any(d < 0 for d in shape):
        raise ValueError(f"need dims >= 0 and shard counts >= 1, got shape {tuple(shape)}, shards {shards}")
    return itemsize * math.prod(-(-d // s) for d, s in zip(shape, shards, strict=True))


@dataclass(frozen=True, slots=True)
class StateRecipe:
    """Bytes per parameter of each part of the training state."""

    name: str
    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        """Bytes per parameter, everything replicated."""
        return self.weights + self.gradients + self.optimizer


# bf16 weights and gradients; fp32 master weights, Adam m and v (4 + 4 + 4).
MIXED_PRECISION_ADAM = StateRecipe("mixed-precision Adam", weights=2, gradients=2, optimizer=12)
# fp32 weights and gradients; Adam m and v (4 + 4).
FP32_ADAM = StateRecipe("fp32 Adam", weights=4, gradients=4, optimizer=8)


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per device of each part of the training state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def training_state_bytes(
    num_params: float, recipe: StateRecipe, zero_stage: int, dp_degree: int
) -> StateBytes:
    """Bytes per device of weights, gradients and optimizer state of ``num_params`` parameters.

    ``zero_stage`` 0–3 says how much is sharded over the ``dp_degree`` data-parallel ranks (module docstring).
    ``num_params`` is what one data-parallel replica holds: divide by tensor/pipeline parallelism first.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if dp_degree < 1 or num_params < 0:
        raise ValueError(f"need dp_degree >= 1 and num_params >= 0, got {dp_degree}, {num_params}")

    def part(bytes_per_param: int, sharded_from_stage: int) -> float:
        divisor = dp_degree if zero_stage >= sharded_from_stage else 1
        return bytes_per_param * num_params / divisor

    return StateBytes(
        weights=part(recipe.weights, 3),
        gradients=part(recipe.gradients, 2),
        optimizer=part(recipe.optimizer, 1),
    )


# -- the rest of a step's memory -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    """The mixed-precision policy of a training step: what each part of the state is stored in.

    Attributes:
        param_dtype: dtype of the weights the model computes with.
        grad_dtype: dtype of the gradients as reduced.
        fp32_grad_accumulation: keep an fp32 gradient buffer (Megatron's ``main_grad``, the default with
            bf16 and ``--accumulate-allreduce-grads-in-fp32``): gradients cost 4 bytes per parameter.
        master_weights: keep an fp32 master copy for the optimizer when ``param_dtype`` is narrower.
        optimizer_states: fp32 moments per parameter (Adam: 2, SGD with momentum: 1, SGD: 0).
        autocast: the dtype ``torch.autocast`` computes matrix products in (None: no autocast): each weight
            is cast to it once per forward and the cast is kept for backward (its bytes count as weights),
            and each weight's gradient is cast back up.
        fused_optimizer: torch's fused AdamW (one kernel over many tensors) rather than the ``foreach``
            default, which reads and writes the state in several passes (``cost_models.memory`` users price
            the update; :data:`FOREACH_ADAMW_BYTES`).
        gather_dtype: the dtype a sharded parameter is cast to before it is all-gathered (None: its own),
            FSDP2's ``MixedPrecisionPolicy.param_dtype`` (torch.distributed.fsdp ``fully_shard`` API docs:
            the unsharded parameter, its all-gather and the compute take that dtype while the optimizer
            steps the sharded parameter in its original one).  Read by
            ``autoshard.problem.autocast.moved_itemsize`` under autocast.
        reduce_dtype: the dtype a parameter's gradient is reduce-scattered or all-reduced in (None: its
            own), ``MixedPrecisionPolicy.reduce_dtype`` (same docs: full-precision reduction under
            low-precision compute).
    """

    param_dtype: str = "bfloat16"
    grad_dtype: str = "bfloat16"
    fp32_grad_accumulation: bool = False
    master_weights: bool = True
    optimizer_states: int = 2
    autocast: str | None = None
    fused_optimizer: bool = True
    gather_dtype: str | None = None
    reduce_dtype: str | None = None

    def recipe(self) -> StateRecipe:
        """Bytes per parameter of weights, gradients and optimizer state under this policy."""
        weights = itemsize(self.param_dtype)
        grads = 4 if self.fp32_grad_accumulation else itemsize(self.grad_dtype)
        master = 4 if self.master_weights and weights < 4 else 0
        name = f"{canonical_dtype(self.param_dtype)} weights, {grads}-byte grads, {self.optimizer_states} fp32 moments"
        if self.autocast is not None:
            name += f", autocast to {canonical_dtype(self.autocast)}"
            weights += itemsize(self.autocast)  # the per-forward cast, kept by backward
        return StateRecipe(
            name, weights=weights, gradients=grads, optimizer=master + 4 * self.optimizer_states
        )

    def describe(self) -> str:
        """One line for the report."""
        r = self.recipe()
        return f"{r.name} ({r.total} B/param before sharding)"


AMP_BF16 = PrecisionPolicy(
    param_dtype="float32",
    grad_dtype="float32",
    master_weights=False,
    autocast="bfloat16",
    fused_optimizer=False,
    gather_dtype="bfloat16",
    reduce_dtype="float32",
)
"""torch's default mixed precision: fp32 weights, gradients and Adam moments, ``torch.autocast(bfloat16)``
around the forward, ``torch.optim.AdamW`` (foreach).  18 bytes per parameter with the kept casts.  Sharded
(FSDP / ZeRO-3) parameters are gathered in bf16 and their gradients reduced in fp32, as FSDP2's
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` does (torchtitan's default
``mixed_precision_param``/``mixed_precision_reduce``); the emitted program does the same under autocast
(``autoshard.codegen.collectives.gather_dtype``)."""

RECIPES: dict[str, PrecisionPolicy | None] = {"bf16": None, "amp": AMP_BF16}
"""Precision recipes a plan can be priced for, by name: ``bf16`` (the model's own dtypes; 16-bit weights get
an fp32 master copy and torch's fused AdamW) and ``amp`` (:data:`AMP_BF16`)."""

FOREACH_ADAMW_BYTES = 94.0
"""Bytes of achieved HBM bandwidth per fp32 parameter one step of ``torch.optim.AdamW`` (foreach, the
default) costs: measured on an H100 80GB (benchmarks/results/gpu_kernels.json, 2026-11-24 second session):
500 M parameters in 150 tensors 15.7 ms, 124 M 4.18 ms (94.1 and 100.9 bytes per element at the copy's
2.994 TB/s; fused AdamW on the same lists: 36.0 and 39.0)."""

Recomputation = str  # "none" | "selective" | "full"


def transformer_activation_bytes(
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: Recomputation = "none",
) -> float:
    """Bytes one transformer layer keeps for backward, 16-bit activations (Korthikanti et al., 2022, §4).

    none: ``sbh(10 + 24/t + 5as/(ht))`` (TP), ``sbh(34 + 5as/h)/t`` with sequence parallelism; selective
    (attention core recomputed, with SP): ``34·sbh/t``; full: the layer input ``2sbh`` (÷t with SP).
    """
    sbh = float(seq) * micro_batch * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    if recompute == "selective":
        return 34 * sbh / tp if sequence_parallel else sbh * (10 + 24 / tp)
    if recompute != "none":
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    attention = 5 * heads * seq / (hidden * tp)
    if sequence_parallel:
        return sbh * (34 / tp + attention)
    return sbh * (10 + 24 / tp + attention)


def microbatches_in_flight(stages: int, virtual_stages: int = 1, microbatches: int | None = None) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak under 1F1B.

    ``p`` for plain 1F1B, ``p · (1 + (p − 1)/(p · v))`` interleaved (Korthikanti et al., 2022, §4.2.3), never
    more than the micro-batches there are.
    """
    held = stages * (1 + (stages - 1) / (stages * virtual_stages)) if virtual_stages > 1 else float(stages)
    return min(held, float(microbatches)) if microbatches is not None else held


def logits_bytes(tokens: float, vocab: int, tp: int = 1) -> float:
    """fp32 logits the loss keeps (cross-entropy in fp32 over the vocabulary shard): ``4 · tokens · V / t``."""
    return 4.0 * tokens * vocab / tp


def gathered_weight_bytes(layer_param_bytes: float, prefetch: int) -> float:
    """FSDP: the unsharded weights of the layer computing plus the ``prefetch`` layers gathered ahead."""
    return layer_param_bytes * (1 + prefetch)
