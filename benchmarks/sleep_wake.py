"""What sleeping costs (engine/worker/sleep.py): the seconds to give a model's device memory back and to take it
again, and the device memory freed as the driver counts it, beside the plain copies it is made of (every
tensor to host memory and back with .to(), the baseline), same process, side by side.

The "model" is what a 27B at ~4.6 bits holds, scaled by --gib: 64 layers of weight-shaped tensors and a
KV pool; weight shapes do not change copy speed, only bytes do. On CUDA the host copies are pageable (what
the engine does) and, beside them, page-locked (what it would gain by pinning). Median of the repeats.

    python benchmarks/sleep_wake.py [--gib 4] [--repeat 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.worker.sleep import DeviceMemory


def model_like(gib: float, device: torch.device) -> torch.nn.Module:
    """64 layers of uint8 tensors (packed 4-bit weights: 80% of the bytes) and a KV pool (20%)."""
    total = int(gib * 2**30)
    per_layer = int(total * 0.8) // 64 // 4
    m = torch.nn.Module()
    m.layers = torch.nn.ModuleList()
    for _ in range(64):
        layer = torch.nn.Module()
        for name in ("qkv", "o", "gate_up", "down"):
            layer.register_buffer(name, torch.empty(per_layer, dtype=torch.uint8, device=device).fill_(7))
        m.layers.append(layer)
    m.kv = torch.empty(total - 64 * 4 * per_layer, dtype=torch.uint8, device=device).fill_(3)
    return m


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    model = model_like(args.gib, device)
    tensors = [*(t for _, t in model.named_buffers()), model.kv]
    plain_out, plain_in = [], []
    for _ in range(args.repeat):
        host: list[torch.Tensor] = []
        plain_out.append(timed(lambda h=host: h.extend(t.to("cpu", copy=True) for t in tensors), device))
        plain_in.append(timed(lambda h=host: [t.to(device, copy=True) for t in h], device))
    del host
    gib = sum(t.numel() for t in tensors) / 2**30
    out_s, in_s = statistics.median(plain_out), statistics.median(plain_in)
    print(f"{args.device}: {gib:.2f} GiB in {len(tensors)} tensors, median of {args.repeat}")
    print(
        f"plain   .to('cpu') {out_s:.2f} s ({gib / out_s:.1f} GiB/s)   .to(device) {in_s:.2f} s ({gib / in_s:.1f} GiB/s)"
    )
    for pin in (False, True) if device.type == "cuda" else (False,):
        sleeps, wakes, freed = [], [], []
        for _ in range(args.repeat):
            memory = DeviceMemory([model], device, pin=pin)
            before = free_bytes(device)
            sleeps.append(timed(memory.release, device))
            freed.append(free_bytes(device) - before)
            wakes.append(timed(memory.restore, device))
        assert all(bool((layer.qkv == 7).all()) for layer in model.layers) and bool((model.kv == 3).all())
        sleep_s, wake_s = statistics.median(sleeps), statistics.median(wakes)
        kind = "pinned  " if pin else "pageable"
        print(
            f"{kind} sleep {sleep_s:.2f} s ({gib / sleep_s:.1f} GiB/s, {out_s / sleep_s:.2f}x plain)   "
            f"wake {wake_s:.2f} s ({gib / wake_s:.1f} GiB/s, {in_s / wake_s:.2f}x plain)"
        )
        if device.type == "cuda":
            print(
                f"{kind} device memory freed while asleep (driver's count): {statistics.median(freed) / 2**30:.2f} GiB"
            )


if __name__ == "__main__":
    main()
