"""Times PyTorch's scaled_dot_product_attention backward with the cuDNN and the flash
backends at the shapes of dev/bench_attention_backward.cpp (B=4, H=16, S=4096, D=128, FP16
and BF16, non-causal and causal): CUDA events around torch.autograd.grad of the forward's
output (the backward alone), warm-up, then the median of --reps runs, as TFLOP/s with FLOPs =
2.5 x 4 B H S^2 D (halved for causal). Prints one line per configuration; --json writes them.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    results = []
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("torch_flash", SDPBackend.FLASH_ATTENTION)]
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        g = torch.Generator(device="cuda").manual_seed(1)
        shape = (a.batch, a.heads, a.seq, a.dim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
        for causal in (False, True):
            flops = 2.5 * 4.0 * a.batch * a.heads * a.seq * a.seq * a.dim / (2 if causal else 1)
            for name, backend in backends:
                try:
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        times = []
                        for r in range(a.warmup + a.reps):
                            e0 = torch.cuda.Event(enable_timing=True)
                            e1 = torch.cuda.Event(enable_timing=True)
                            e0.record()
                            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                            e1.record()
                            e1.synchronize()
                            if r >= a.warmup:
                                times.append(e0.elapsed_time(e1))
                        del out
                except RuntimeError as err:
                    print(f"{name:11s} {dtype_name} {'causal' if causal else 'non-causal':10s}: failed: {str(err).splitlines()[0]}")
                    continue
                med = statistics.median(times)
                tflops = flops / (med * 1e-3) / 1e12
                print(f"{name:11s} {dtype_name} {'causal' if causal else 'non-causal':10s} B{a.batch} H{a.heads} S{a.seq} D{a.dim}: "
                      f"median {med:.3f} ms (min {min(times):.3f}, max {max(times):.3f}, {a.reps} reps) {tflops:.1f} TFLOP/s")
                results.append(dict(impl=name, dtype=dtype_name, causal=causal, batch=a.batch, heads=a.heads, seq=a.seq,
                                    dim=a.dim, median_ms=round(med, 4), min_ms=round(min(times), 4), reps=a.reps,
                                    tflops=round(tflops, 2)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
