"""Where a decode step's time goes on MLX's GPU backend: a Qwen2.5-0.5B-shaped int4 decoder
written directly in MLX (random weights), timed in variants that each change one thing, so
the EP's lowerings can be held against what MLX itself reaches.

Variants (each: prefill of PROMPT tokens, then STEPS greedy steps, logits read on the host
every step, as an ONNX Runtime caller does; ms/token is the median step):
  lm           fused rms_norm and rope, fused attention over the grown prefix of a
               preallocated cache (mlx-lm's way), eager graph building
  lm-compiled  static-mask's step through mx.compile (one trace: every step has the same shapes)
  manual-norm  RMS norm from elementwise ops and a mean
  table-rope   rotary from cos/sin tables gathered at the position (the ONNX models' way)
  static-mask  attention over the whole static buffer with an additive mask (genai's shared
               buffer), K/V updated by slice_update at a position held in an array
  f32-attn     attention inputs widened to float32 first
  float32      float32 activations throughout

Usage: python3 gpu/decode_probe.py [--prompt 128] [--steps 32] [--variants a,b] [--json PATH]
"""

import argparse
import json
import statistics
import time

import mlx.core as mx
import numpy as np

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD, MLP, VOCAB = 24, 896, 14, 2, 64, 4864, 151936
EPS = 1e-6
BASE = 10000.0


def qweight(n, k, dtype):
    w = (mx.random.normal((n, k)) * 0.02).astype(dtype)
    return mx.quantize(w, group_size=32, bits=4)


class Model:
    def __init__(self, dtype, max_len):
        mx.random.seed(1)
        self.dtype = dtype
        self.max_len = max_len
        self.embed = (mx.random.normal((VOCAB, HIDDEN)) * 0.02).astype(dtype)
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(
                dict(
                    ln1=mx.ones((HIDDEN,), dtype),
                    qkv=qweight((HEADS + 2 * KV_HEADS) * HEAD, HIDDEN, dtype),
                    o=qweight(HIDDEN, HEADS * HEAD, dtype),
                    ln2=mx.ones((HIDDEN,), dtype),
                    gate=qweight(MLP, HIDDEN, dtype),
                    up=qweight(MLP, HIDDEN, dtype),
                    down=qweight(HIDDEN, MLP, dtype),
                )
            )
        self.norm = mx.ones((HIDDEN,), dtype)
        self.lm_head = qweight(VOCAB, HIDDEN, dtype)
        inv = 1.0 / (BASE ** (mx.arange(0, HEAD, 2, dtype=mx.float32) / HEAD))
        ang = mx.arange(max_len, dtype=mx.float32)[:, None] * inv[None, :]
        self.cos, self.sin = mx.cos(ang).astype(dtype), mx.sin(ang).astype(dtype)
        mx.eval(self.embed, self.layers, self.norm, self.lm_head, self.cos, self.sin)


def qmm(x, w):
    return mx.quantized_matmul(x, *w, transpose=True, group_size=32, bits=4)


def rms(x, w, manual):
    if not manual:
        return mx.fast.rms_norm(x, w, EPS)
    xf = x.astype(mx.float32)
    y = xf * mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + EPS)
    return (y * w.astype(mx.float32)).astype(x.dtype)


def table_rope(x, m, pos, seq):
    p = pos + mx.arange(seq)
    c, s = m.cos[p][None, None], m.sin[p][None, None]
    h = HEAD // 2
    a, b = x[..., :h].astype(mx.float32), x[..., h:].astype(mx.float32)
    c, s = c.astype(mx.float32), s.astype(mx.float32)
    return mx.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(x.dtype)


def forward(m, v, ids, pos, caches):
    """ids [1, S]; pos: int (python) or [] int32 array; caches: per layer (K, V) buffers
    [1, KV_HEADS, max_len, HEAD]. Returns logits of the last position and the caches."""
    seq = ids.shape[1]
    manual = v == "manual-norm"
    x = m.embed[ids]
    new_caches = []
    for layer, (kc, vc) in zip(m.layers, caches):
        h = rms(x, layer["ln1"], manual)
        qkv = qmm(h, layer["qkv"])
        nq, nk = HEADS * HEAD, KV_HEADS * HEAD
        q = qkv[..., :nq].reshape(1, seq, HEADS, HEAD).transpose(0, 2, 1, 3)
        k = qkv[..., nq : nq + nk].reshape(1, seq, KV_HEADS, HEAD).transpose(0, 2, 1, 3)
        vv = qkv[..., nq + nk :].reshape(1, seq, KV_HEADS, HEAD).transpose(0, 2, 1, 3)
        if v == "table-rope":
            q, k = table_rope(q, m, pos, seq), table_rope(k, m, pos, seq)
        else:
            q = mx.fast.rope(q, HEAD, traditional=False, base=BASE, scale=1.0, offset=pos)
            k = mx.fast.rope(k, HEAD, traditional=False, base=BASE, scale=1.0, offset=pos)
        if v == "static-mask":
            start = mx.array(pos, mx.int32) if isinstance(pos, int) else pos
            kc = mx.slice_update(kc, k, start.reshape(1), axes=(2,))
            vc = mx.slice_update(vc, vv, start.reshape(1), axes=(2,))
            keys_pos = mx.arange(m.max_len)
            qpos = start + mx.arange(seq)
            mask = mx.where(keys_pos[None, :] <= qpos[:, None], 0.0, -mx.inf).astype(q.dtype)
            a = mx.fast.scaled_dot_product_attention(q, kc, vc, scale=HEAD**-0.5, mask=mask)
        else:
            p = int(pos)
            kc[..., p : p + seq, :] = k
            vc[..., p : p + seq, :] = vv
            keys, values = kc[..., : p + seq, :], vc[..., : p + seq, :]
            if v == "f32-attn":
                q32, k32, v32 = q.astype(mx.float32), keys.astype(mx.float32), values.astype(mx.float32)
                a = mx.fast.scaled_dot_product_attention(
                    q32, k32, v32, scale=HEAD**-0.5, mask="causal" if seq > 1 else None
                ).astype(q.dtype)
            else:
                a = mx.fast.scaled_dot_product_attention(
                    q, keys, values, scale=HEAD**-0.5, mask="causal" if seq > 1 else None
                )
        a = a.transpose(0, 2, 1, 3).reshape(1, seq, nq)
        x = x + qmm(a, layer["o"])
        h = rms(x, layer["ln2"], manual)
        g = qmm(h, layer["gate"])
        x = x + qmm(g * mx.sigmoid(g) * qmm(h, layer["up"]), layer["down"])
        new_caches.append((kc, vc))
    last = x[:, -1:, :]
    logits = qmm(rms(last, m.norm, manual), m.lm_head)
    return logits.reshape(VOCAB), new_caches


def generate(m, v, prompt, steps):
    caches = [
        (mx.zeros((1, KV_HEADS, m.max_len, HEAD), m.dtype), mx.zeros((1, KV_HEADS, m.max_len, HEAD), m.dtype))
        for _ in range(LAYERS)
    ]
    ids = mx.array([prompt], mx.int32)
    pos = 0
    times = []
    step_fn = forward
    if v == "lm-compiled":
        # The position held as an array, the caches static buffers: every step has the same
        # shapes, so one trace serves them all.
        def body(ids, pos_arr, *flat):
            cs = [(flat[2 * i], flat[2 * i + 1]) for i in range(LAYERS)]
            logits, out = forward_static(m, ids, pos_arr, cs)
            return [logits] + [t for kv in out for t in kv]

        compiled = mx.compile(body)
    for step in range(steps + 1):
        t0 = time.perf_counter()
        if v == "lm-compiled" and step > 0:
            res = compiled(ids, mx.array(pos, mx.int32), *[t for kv in caches for t in kv])
            logits, flat = res[0], res[1:]
            caches = [(flat[2 * i], flat[2 * i + 1]) for i in range(LAYERS)]
        else:
            vv = "static-mask" if v == "lm-compiled" else v
            p = mx.array(pos, mx.int32) if vv == "static-mask" else pos
            logits, caches = step_fn(m, vv, ids, p, caches)
        mx.eval(logits, caches)
        host = np.array(logits.astype(mx.float32))  # the logits on the host, as a caller reads them
        tok = int(host.argmax())
        times.append((time.perf_counter() - t0) * 1000)
        pos += ids.shape[1]
        ids = mx.array([[tok]], mx.int32)
    return times


def forward_static(m, ids, pos_arr, caches):
    return forward(m, "static-mask", ids, pos_arr, caches)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--variants", default="lm,lm-compiled,manual-norm,table-rope,static-mask,f32-attn,float32")
    ap.add_argument("--json")
    a = ap.parse_args()
    print("MLX", mx.__version__, mx.default_device(), flush=True)
    results = {}
    models = {}
    max_len = 256
    for v in a.variants.split(","):
        dtype = mx.float32 if v == "float32" else mx.float16
        if dtype not in models:
            t0 = time.perf_counter()
            models[dtype] = Model(dtype, max_len)
            print(f"weights {dtype}: {time.perf_counter() - t0:.1f} s", flush=True)
        m = models[dtype]
        prompt = [(7 * i + 3) % VOCAB for i in range(a.prompt)]
        vv = "lm" if v == "float32" else v
        t0 = time.perf_counter()
        first = generate(m, vv, prompt, a.steps)
        cold = time.perf_counter() - t0
        second = generate(m, vv, prompt, a.steps)
        r = dict(
            cold_s=round(cold, 2),
            prefill_ms=round(second[0], 2),
            decode_ms=round(statistics.median(second[1:]), 3),
            decode_ms_first_generation=round(statistics.median(first[1:]), 3),
        )
        results[v] = r
        print(f"{v:12s} {r}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
