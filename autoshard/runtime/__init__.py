"""Run emitted modules: local process groups and ``torchrun`` (:mod:`~autoshard.runtime.launch`), and the
end-to-end check against the single-device model (:mod:`~autoshard.runtime.verify`).

From a plan to a training job, one concern per module:

- :mod:`~autoshard.runtime.materialize` -- shard-only materialisation of a model built on ``meta``: the
  model's own init seeded per module, or slices of a Hugging Face safetensors checkpoint
  (``parallelize(..., weights=...)``);
- :mod:`~autoshard.runtime.zero` -- ZeRO-1/2 optimizer sharding as the cost model prices it (gradient
  reduce-scatter, sharded AdamW state, updated chunks all-gathered); :mod:`~autoshard.runtime.reshard` frees
  FSDP-gathered weights after use and re-gathers them in backward;
- :mod:`~autoshard.runtime.grad_sync` -- the one pass that takes gradient syncs out of the backward (run once
  per step under pipelines, reduce-scattered by ZeRO, bucketed by the overlap);
- :mod:`~autoshard.runtime.overlap` and :mod:`~autoshard.runtime.prefetch` -- ``Plan.overlap`` executed:
  gradient all-reduces / ZeRO-2 reduce-scatters bucketed and asynchronous during backward, FSDP all-gathers
  prefetched ``prefetch`` layers ahead in forward and backward (``apply_overlap``);
- :mod:`~autoshard.runtime.rng` -- dropout masks equal to the single-device model's (run by ``parallelize``);
- :mod:`~autoshard.runtime.checkpoint` -- DCP save / load across plans and world sizes, safetensors export;
- :mod:`~autoshard.runtime.export` -- a plan applied with torch's DTensor parallel styles and ``fully_shard``.

Example::

    from autoshard.runtime.verify import run_verify
    print(run_verify("gpt2-tiny", nproc=4))       # launches 4 gloo ranks, compares outputs and gradients
"""

from autoshard.runtime.launch import LaunchError, default_device, device_mesh, init_from_env, launch

__all__ = ["LaunchError", "default_device", "device_mesh", "init_from_env", "launch"]
