"""Where a cold start's kernel compilation went: the modules MLX's CUDA backend wrote into a
kernel cache directory, in the order they were written, each with the time since the one
before (its NVRTC compilation, roughly: a run compiles one module at a time) and its source
size. Fused elementwise kernels (`mlx_compile`'s) are told apart from MLX's own JIT kernels
(gather, slice updates, quantized matmuls, ...).

    python3 gpu/kernel_times.py DIR [--start EPOCH_S]
"""

import argparse
import os
import re


def fused(name: str) -> bool:
    # mlx_compile's kernels are named after their tape: "<letters><dtype><I|O><Primitive>...".
    return re.match(r"^[A-Z]+[bfiuc][0-9]+[IO][A-Z][a-z]", name) is not None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--start", type=float, default=None, help="when the run began (epoch seconds)")
    a = ap.parse_args()
    mods = []
    for root, _, files in os.walk(a.dir):
        for f in files:
            if f.endswith(".ptx"):
                p = os.path.join(root, f)
                cu = p[:-4] + ".cu"
                size = os.path.getsize(cu) if os.path.exists(cu) else 0
                rel = os.path.relpath(p, a.dir)[:-4].replace(os.sep, "")
                mods.append((os.path.getmtime(p), rel, size, os.path.getsize(p)))
    mods.sort()
    if not mods:
        print(f"{a.dir}: no modules")
        return
    prev = a.start if a.start is not None else mods[0][0]
    totals = {"fused": [0, 0.0], "other": [0, 0.0]}
    print(f"{'dt s':>7} {'src KB':>7} {'bin KB':>7}  kind   module")
    for t, name, size, binsize in mods:
        dt = t - prev
        prev = t
        kind = "fused" if fused(name) else "other"
        totals[kind][0] += 1
        totals[kind][1] += dt
        print(f"{dt:7.2f} {size / 1024:7.1f} {binsize / 1024:7.1f}  {kind:5}  {name[:150]}")
    for kind, (n, s) in totals.items():
        print(f"{kind}: {n} modules, {s:.1f} s (time since the previous module, summed)")


if __name__ == "__main__":
    main()
