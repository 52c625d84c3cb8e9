"""Probe the memory-bound kernels a training step runs besides its GEMMs, by size: bytes of achieved HBM
bandwidth per element, the figures the step's elementwise terms are priced with.

    OUT=results python benchmarks/gpu_kernels.py      # on a CUDA machine: gpu_kernels.json under $OUT

Each kernel is timed with CUDA events over back-to-back calls (median of 5 rounds), inputs random, two input
sets rotated so that repeated calls do not run from L2.  ``bytes_per_element`` = seconds x the 2 GiB copy's
bandwidth (measured here, read + write) / elements: 6 for a bf16 <-> fp32 cast at the roofline.
"""

import json
import os
import statistics

import torch

dev = "cuda"
res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": []}


def bench(fn, sets, it=20):
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(it):
            fn(*sets[i % len(sets)])
        b.record()
        torch.cuda.synchronize()
        rounds.append(a.elapsed_time(b) / it / 1e3)
    return statistics.median(rounds)


x = torch.randn(2**28, device=dev)
y = torch.empty_like(x)
bw = 2 * x.numel() * 4 / bench(lambda a, b: b.copy_(a), [(x, y)], 10)
res["copy_bytes_per_s"] = bw
del x, y
H = 2048
bf, f32 = torch.bfloat16, torch.float32
cases = {  # name: (make inputs of n elements, kernel)
    "cast bf16->fp32": (lambda n: (torch.randn(n, device=dev, dtype=bf),), lambda a: a.float()),
    "cast fp32->bf16": (lambda n: (torch.randn(n, device=dev),), lambda a: a.to(bf)),
    "copy_ fp32 into bf16": (
        lambda n: (torch.randn(n, device=dev), torch.empty(n, device=dev, dtype=bf)),
        lambda a, b: b.copy_(a),
    ),
    "add bf16": (lambda n: (torch.randn(n, device=dev, dtype=bf),) * 2, lambda a, b: a + b),
    "add fp32": (lambda n: (torch.randn(n, device=dev),) * 2, lambda a, b: a + b),
    "mul bf16 x weight[H]": (
        lambda n: (torch.randn(n // H, H, device=dev, dtype=bf), torch.randn(H, device=dev, dtype=bf)),
        lambda a, w: a * w,
    ),
    "mul fp32 x rsqrt[rows,1]": (
        lambda n: (torch.randn(n // H, H, device=dev), torch.randn(n // H, 1, device=dev)),
        lambda a, r: a * r,
    ),
    "mul bf16 x fp32 (promote)": (
        lambda n: (torch.randn(n, device=dev, dtype=bf), torch.randn(n, device=dev)),
        lambda a, b: a * b,
    ),
    "pow fp32": (lambda n: (torch.randn(n, device=dev),), lambda a: a.pow(2)),
    "mean fp32 rows": (lambda n: (torch.randn(n // H, H, device=dev),), lambda a: a.mean(-1, keepdim=True)),
    "sum bf16 cols (weight grad)": (
        lambda n: (torch.randn(n // H, H, device=dev, dtype=bf),),
        lambda a: a.sum(0),
    ),
    "rms_norm fp32 (HF, fwd)": (
        lambda n: (torch.randn(n // H, H, device=dev, dtype=bf), torch.randn(H, device=dev, dtype=bf)),
        lambda a, w: w * (a.float() * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf),
    ),
}
for name, (make, fn) in cases.items():
    for n in (2**16, 2**20, 2**22, 2**24, 2**26):
        sets = [make(n), make(n)]
        t = bench(fn, sets, 50 if n <= 2**22 else 20)
        res["kernels"].append({"kernel": name, "elements": n, "seconds": t, "bytes_per_element": t * bw / n})
        del sets
launch = bench(lambda a: a.add_(1), [(torch.empty(1, device=dev),)], 200)
res["launch_floor_s"] = launch
# optimizers over a GPT-2-like list of tensors: 150 tensors, 124 M fp32 parameters; and a 1.24 B list
for total, count in ((124_000_000, 150), (500_000_000, 150)):
    sizes = [total // count] * count
    params = [torch.randn(s, device=dev, requires_grad=True) for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    for kind in ("foreach", "fused"):
        opt = torch.optim.AdamW(params, lr=1e-4, **{kind: True})
        t = bench(lambda opt=opt: opt.step(), [()], 5)
        res["kernels"].append(
            {"kernel": f"AdamW {kind} fp32", "elements": total, "tensors": count, "seconds": t,
             "bytes_per_element": t * bw / total}
        )  # fmt: skip
    del params, opt
for r in res["kernels"]:
    print(
        f"{r['kernel']:30s} {r['elements']:>11d} {r['seconds'] * 1e6:10.1f} us {r['bytes_per_element']:7.2f} B/el"
    )
print(f"copy {bw / 1e12:.3f} TB/s, launch floor {launch * 1e6:.1f} us")
out = os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results"))
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "gpu_kernels.json"), "w") as f:
    json.dump(res, f, indent=1)
