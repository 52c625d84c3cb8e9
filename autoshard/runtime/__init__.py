"""Run emitted modules: local process groups and ``torchrun`` (:mod:`~autoshard.runtime.launch`), and the
end-to-end check against the single-device model (:mod:`~autoshard.runtime.verify`).

Example::

    from autoshard.runtime.verify import run_verify
    print(run_verify("gpt2-tiny", nproc=4))       # launches 4 gloo ranks, compares outputs and gradients
"""

from autoshard.runtime.launch import LaunchError, default_device, device_mesh, init_from_env, launch

__all__ = ["LaunchError", "default_device", "device_mesh", "init_from_env", "launch"]
