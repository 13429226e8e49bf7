"""What one MLX kernel of a decode step costs on the device, float16 against float32: chains
of the same operation on a Qwen2.5-0.5B decode step's shapes, each chain one compiled
function (so the time is dispatch plus kernel, as in the EP's compiled graph), median of
repeated evaluations divided by the chain's length, in microseconds.

  qmv-896      x[1,896] @ int4 W[896,896] (group 32), chained
  qmv-4864     x[1,896] @ int4 W[4864,896], then back through W[896,4864]
  qmv-vocab    x[1,896] @ int4 W[151936,896] (the lm_head)
  sdpa-96x2048 one query token, 14 heads over 2 KV heads of 96 (64 padded with the mask
               column), 2048 keys (a static buffer)
  sdpa-64x160  the same, heads of 64 over 160 keys (the grown prefix, mlx-lm's way)
  rms          rms_norm of [1,896]
  astype       float16 <-> float32 round trips of [1,896] (float32: float32 <-> float16)
  add          x + c on [1,896]

usage: python3 gpu/kernel_probe.py [--json PATH]"""
import json
import statistics
import sys
import time

import mlx.core as mx


def timed(fn, args, n, reps=20):
    out = fn(*args)
    mx.eval(out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / n * 1e6


def qweights(n, k, dtype):
    return mx.quantize((mx.random.normal((n, k)) * 0.02).astype(dtype), group_size=32, bits=4)


def main():
    results = {}
    for dtype, name in ((mx.float16, "float16"), (mx.float32, "float32")):
        r = results.setdefault(name, {})
        x = (mx.random.normal((1, 896)) * 0.1).astype(dtype)
        w, s, b = qweights(896, 896, dtype)
        n = 100

        def qchain(x):
            for _ in range(n):
                x = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=4)
            return x

        r["qmv-896"] = timed(mx.compile(qchain), (x,), n)
        w1, s1, b1 = qweights(4864, 896, dtype)
        w2, s2, b2 = qweights(896, 4864, dtype)

        def mlp(x):
            for _ in range(24):
                h = mx.quantized_matmul(x, w1, s1, b1, transpose=True, group_size=32, bits=4)
                x = mx.quantized_matmul(h, w2, s2, b2, transpose=True, group_size=32, bits=4)
            return x

        r["qmv-4864 (pair)"] = timed(mx.compile(mlp), (x,), 24)
        wv, sv, bv = qweights(151936, 896, dtype)

        def head(x):
            return [mx.quantized_matmul(x, wv, sv, bv, transpose=True, group_size=32, bits=4) for _ in range(10)]

        r["qmv-vocab"] = timed(mx.compile(head), (x,), 10)
        for label, d, keys in (("sdpa-96x2048", 96, 2048), ("sdpa-64x160", 64, 160)):
            q = (mx.random.normal((1, 14, 1, d)) * 0.1).astype(dtype)
            k = (mx.random.normal((1, 2, keys, d)) * 0.1).astype(dtype)
            v = (mx.random.normal((1, 2, keys, d)) * 0.1).astype(dtype)

            def att(q, k=k, v=v):
                for _ in range(50):
                    q = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125)
                return q

            r[label] = timed(mx.compile(att), (q,), 50)
        g = mx.ones((896,), dtype=dtype)

        def rms(x):
            for _ in range(100):
                x = mx.fast.rms_norm(x, g, 1e-6)
            return x

        r["rms"] = timed(mx.compile(rms), (x,), 100)
        other = mx.float32 if dtype == mx.float16 else mx.float16

        def cast(x):
            for _ in range(50):
                x = x.astype(other).astype(dtype)
            return x

        # (Compiled, a chain of casts would fuse: eager, dispatch included.)
        r["astype (eager)"] = timed(cast, (x,), 100)

        def add(x):
            for _ in range(100):
                x = x + 1e-3
            return x

        r["add (eager)"] = timed(add, (x,), 100)
        print(name, {k: round(v, 2) for k, v in r.items()}, flush=True)
    if "--json" in sys.argv:
        json.dump(results, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
