"""Probe one GPU: GEMM throughput by size and dtype, HBM copy bandwidth, and the kernel launch floor.

    OUT=results python benchmarks/gpu_probe.py

Feeds the compute-efficiency figures of the hardware profiles (hardware_profiles/*.json cite the result file).
Needs a CUDA device; prints and writes gpu_probe.json under $OUT (default benchmarks/results).
"""

import json
import os

import torch

dev = "cuda"
print(torch.__version__, torch.cuda.get_device_name())
res = {"device": torch.cuda.get_device_name(), "gemm": [], "copy": []}


def bench(fn, it=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(it):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / it / 1e3


for dt in (torch.bfloat16, torch.float32):
    torch.backends.cuda.matmul.allow_tf32 = False
    for n in (256, 512, 1024, 2048, 4096, 8192, 16384):
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        t = bench(lambda a=a, b=b: a @ b, it=10 if n >= 8192 else 50)
        res["gemm"].append(
            {"dtype": str(dt), "n": n, "flops": 2 * n**3, "seconds": t, "tflops": 2 * n**3 / t / 1e12}
        )
    # LLaMA-like shapes: tokens x hidden @ hidden x ffn
for m, k, nn in ((8192, 4096, 14336), (4096, 4096, 4096), (8192, 8192, 28672 // 8), (1024, 8192, 32768)):
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, nn, device=dev, dtype=torch.bfloat16)
    t = bench(lambda a=a, b=b: a @ b, 20)
    res["gemm"].append(
        {
            "dtype": "llama-shape bf16",
            "m": m,
            "k": k,
            "n": nn,
            "flops": 2 * m * k * nn,
            "seconds": t,
            "tflops": 2 * m * k * nn / t / 1e12,
        }
    )
# A linear layer's three products (y = x W^T, dx = dy W, dW = dy^T x) with a row not a multiple of 16 bytes
# (GPT-2's vocabulary 50257, BERT's 30522) against the padded size: cuBLAS's alignment fallback
res["linear_fwd_bwd"] = []
for m, k, nn in ((8192, 768, 50257), (8192, 768, 50304), (16384, 768, 30522), (16384, 768, 30528),
                 (8192, 4096, 4097), (8192, 4096, 4096), (8192, 4097, 4096), (8193, 4096, 4096)):  # fmt: skip
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(nn, k, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(m, nn, device=dev, dtype=torch.bfloat16)
    times = [
        bench(lambda x=x, w=w: torch.nn.functional.linear(x, w), 20),
        bench(lambda dy=dy, w=w: dy @ w, 20),
        bench(lambda dy=dy, x=x: dy.t() @ x, 20),
    ]
    res["linear_fwd_bwd"].append({
        "m": m, "k": k, "n": nn, "flops_each": 2 * m * k * nn, "seconds": times,
        "tflops": [2 * m * k * nn / t / 1e12 for t in times],
    })  # fmt: skip
for mb in (1, 16, 256, 2048):
    x = torch.empty(mb * 2**20 // 4, device=dev)
    y = torch.empty_like(x)
    t = bench(lambda x=x, y=y: y.copy_(x), 50)
    res["copy"].append({"MiB": mb, "seconds": t, "GBps": 2 * mb * 2**20 / t / 1e9})
t = bench(lambda: torch.empty(1, device=dev).add_(1), 200)
res["launch_floor_s"] = t
print(json.dumps(res, indent=1))
out = os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results"))
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "gpu_probe.json"), "w") as f:
    json.dump(res, f, indent=1)
