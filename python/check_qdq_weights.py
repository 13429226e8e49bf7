"""Weight-quantized MatMuls in QDQ form: `x @ DequantizeLinear(w)` with `w` a constant of 8 or
4 bits (int8, uint8, int4, uint4; per tensor, per column, in blocks of 32/64/128 along K;
with and without a zero point; float32 and float16 activations of rank 1 to 3). The MLX EP
multiplies such a weight as MLX's quantized matmul on the stored integers (see
crates/ops-quant/src/affine_weight.rs); this checks that it does (for one row, the session's
compiled graph holds a QuantizedMatmul and no dense Matmul), that every node runs on the MLX EP, and
that the result is allclose to ORT's CPU EP with graph optimizations off (with them on, ORT
rewrites the pair into MatMulNBits, which by default quantizes the activations to 8 bits: not
the exact product). A DequantizeLinear whose output also leaves the graph keeps its float
output exact.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin (in the GPU's forms,
`ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS=1`, which it sets: the CPU backend keeps the dense product).
`python check_qdq_weights.py --bench` (on a GPU) times each model on the MLX EP against the
same product with the weight dequantized once (an initializer of floats)."""

import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

EP = "MLXExecutionProvider"
RANGES = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT4: (-8, 7), T.UINT4: (0, 15)}
CASES = [
    # name, weight type, K, N, layout (tensor | column | block size), zero point, activation, x shape
    ("int8 per column, zero point", T.INT8, 128, 48, "column", True, T.FLOAT, [3, 128]),
    ("uint8 per tensor", T.UINT8, 96, 20, "tensor", True, T.FLOAT, [2, 5, 96]),
    ("int8 per tensor, no zero point, a vector", T.INT8, 64, 7, "tensor", False, T.FLOAT, [64]),
    ("uint4 in blocks of 32", T.UINT4, 128, 48, 32, True, T.FLOAT, [3, 128]),
    ("int4 in blocks of 64", T.INT4, 192, 40, 64, True, T.FLOAT, [4, 192]),
    ("int4 in blocks of 128, no zero point", T.INT4, 256, 33, 128, False, T.FLOAT, [1, 256]),
    ("int4 per tensor, no zero point", T.INT4, 128, 48, "tensor", False, T.FLOAT, [3, 128]),
    ("int8 per column, float16", T.INT8, 128, 48, "column", True, T.FLOAT16, [3, 128]),
    ("uint4 in blocks of 32, float16", T.UINT4, 64, 16, 32, False, T.FLOAT16, [2, 64]),
    # One row: the quantized kernel itself on a GPU (more rows dequantize for a dense product).
    ("one row: uint4 in blocks of 32, zero point", T.UINT4, 128, 40, 32, True, T.FLOAT, [1, 128]),
    ("one row: int4 in blocks of 64, zero point", T.INT4, 192, 24, 64, True, T.FLOAT, [1, 192]),
    ("one row: int8 per column, zero point, float16", T.INT8, 128, 48, "column", True, T.FLOAT16, [1, 128]),
    ("one row: uint4 in blocks of 32, float16", T.UINT4, 64, 16, 32, False, T.FLOAT16, [1, 64]),
]
# Gemm (alpha 0.5, beta 2, a bias row): name, weight type, K, N, layout, zero point, transB, x
GEMM_CASES = [
    ("Gemm, int8 per column", T.INT8, 128, 48, "column", True, 0, [3, 128]),
    ("Gemm transB, int8 per output channel", T.INT8, 128, 48, "column", True, 1, [1, 128]),
    ("Gemm transB, uint4 in blocks of 32", T.UINT4, 128, 40, 32, True, 1, [4, 128]),
    ("Gemm transB, int4 per tensor, one row", T.INT4, 64, 16, "tensor", False, 1, [1, 64]),
]


def qdq_model(wt, k, n, layout, zp, xt, x_shape, seed=0, expose=False, gemm=None):
    """`x @ DequantizeLinear(w)`; with `gemm` = transB (0 or 1), a Gemm with alpha 0.5, beta 2
    and a bias row C, `w` stored `[N, K]` under transB."""
    rng = np.random.default_rng(seed)
    lo, hi = RANGES[wt]
    t = gemm == 1
    w = rng.integers(lo, hi + 1, size=(n, k) if t else (k, n))
    block = layout if isinstance(layout, int) else 0
    if t:
        pshape = [n, k // block] if block else ([n] if layout == "column" else [])
    else:
        pshape = [k // block, n] if block else ([n] if layout == "column" else [])
    npt = np.float32 if xt == T.FLOAT else np.float16
    scale = rng.uniform(0.001, 0.02, size=pshape).astype(npt)
    inits = [h.make_tensor("w", wt, list(w.shape), w.flatten().tolist()), nh.from_array(scale, "s")]
    ins = ["w", "s"]
    z = np.zeros(pshape, np.int64)
    if zp:
        z = rng.integers(lo, hi + 1, size=pshape)
        inits.append(h.make_tensor("z", wt, pshape, np.array(z).flatten().tolist()))
        ins.append("z")
    # The dequantized weight, as numpy computes it (for the benchmark's float model).
    rep = (lambda p: np.repeat(p, block, axis=0)) if block else (lambda p: p)
    dequantized = ((w - rep(z)) * rep(scale.astype(np.float32))).astype(npt) if not t else None
    # Per column of the product (N), or blocks along K: axis 1 / 0 of [K, N], 0 / 1 of [N, K].
    attrs = {"axis": (1 if block else 0) if t else (0 if block else 1)}
    if block:
        attrs["block_size"] = block
    y_shape = x_shape[:-1] + [n]
    if gemm is None:
        nodes = [h.make_node("DequantizeLinear", ins, ["wf"], **attrs), h.make_node("MatMul", ["x", "wf"], ["y"])]
    else:
        inits.append(nh.from_array(rng.uniform(-1, 1, size=[n]).astype(npt), "c"))
        nodes = [h.make_node("DequantizeLinear", ins, ["wf"], **attrs),
                 h.make_node("Gemm", ["x", "wf", "c"], ["y"], transB=gemm, alpha=0.5, beta=2.0)]
    outputs = [h.make_tensor_value_info("y", xt, y_shape)]
    if expose:
        outputs.append(h.make_tensor_value_info("wf", xt, [n, k] if t else [k, n]))
    graph = h.make_graph(nodes, "qdq", [h.make_tensor_value_info("x", xt, x_shape)], outputs, inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m, dequantized


def mlx_session(path, devices):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    return ort.InferenceSession(path, so)


def reference(path, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def placed_on_mlx(session):
    return all(sg.ep_name == EP for sg in session.get_provider_graph_assignment_info())


def check_one(devices, path, name, model, xt, x_shape, seed):
    onnx.save(model, path)
    npt = np.float32 if xt == T.FLOAT else np.float16
    feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, size=x_shape).astype(npt)}
    expected = reference(path, feeds)
    session = mlx_session(path, devices)
    got = session.run(None, feeds)
    rtol, atol = (1e-4, 1e-4) if xt == T.FLOAT else (1e-2, 1e-2)
    close = all(np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
                for g, e in zip(got, expected))
    on_mlx = placed_on_mlx(session)
    worst = max(float(np.abs(g.astype(np.float64) - e.astype(np.float64)).max()) for g, e in zip(got, expected))
    print(f"{'ok  ' if close and on_mlx else 'FAIL'} {name}: max abs diff {worst:.2e}"
          + ("" if on_mlx else " (not every node on the MLX EP)"))
    return 0 if close and on_mlx else 1


def check(devices, tmp):
    failures = 0
    path = os.path.join(tmp, "case.onnx")
    for i, (name, wt, k, n, layout, zp, xt, x_shape) in enumerate(CASES):
        model = qdq_model(wt, k, n, layout, zp, xt, x_shape, seed=i, expose=(i == 1))[0]
        failures += check_one(devices, path, name, model, xt, x_shape, 100 + i)
    for i, (name, wt, k, n, layout, zp, trans_b, x_shape) in enumerate(GEMM_CASES):
        model = qdq_model(wt, k, n, layout, zp, T.FLOAT, x_shape, seed=50 + i, gemm=trans_b)[0]
        failures += check_one(devices, path, name, model, T.FLOAT, x_shape, 200 + i)
    return failures


def graph_of_one(path):
    """The verbose summary of a child process running `path` once: what the compiled graph
    holds."""
    code = (
        "import os, sys, numpy as np, onnxruntime as ort\n"
        "ort.register_execution_provider_library('MLX', os.environ['ORT_MLX_EP_LIB'])\n"
        "dev = [d for d in ort.get_ep_devices() if d.ep_name == 'MLXExecutionProvider']\n"
        "so = ort.SessionOptions(); so.add_provider_for_devices(dev, {})\n"
        "s = ort.InferenceSession(sys.argv[1], so)\n"
        "x = np.zeros([int(d) for d in s.get_inputs()[0].shape], np.float32)\n"
        "s.run(None, {'x': x}); s.run(None, {'x': x})\n"
    )
    env = dict(os.environ, ONNXRUNTIME_EP_MLX_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True, timeout=300)
    return [line for line in out.stderr.splitlines() if "graph per run" in line]


def check_graph(tmp):
    path = os.path.join(tmp, "graph.onnx")
    # One row (a decode step's shape): on a GPU, more rows multiply densely (see
    # AffineWeight::matmul).
    failures = 0
    for label, model in [("MatMul", qdq_model(T.INT8, 128, 48, "column", True, T.FLOAT, [1, 128])[0]),
                         ("Gemm transB", qdq_model(T.INT8, 128, 48, "column", True, T.FLOAT, [1, 128], gemm=1)[0])]:
        onnx.save(model, path)
        lines = graph_of_one(path)
        ok = bool(lines) and all("QuantizedMatmul x" in line and not re.search(r"[ ,:]Matmul x", line)
                                 for line in lines)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label}: the compiled graph multiplies the stored integers: "
              f"{[line.split(': ', 1)[-1] for line in lines]}")
    return failures


def bench(devices, tmp):
    """Decode-shaped products (one row) on the MLX EP: the QDQ weight against the same weight
    dequantized into a float initializer, median ms of 50 runs each."""
    for wt, k, n, layout in [(T.INT8, 4096, 4096, "column"), (T.UINT4, 4096, 4096, 32)]:
        m, dequantized = qdq_model(wt, k, n, layout, True, T.FLOAT, [1, k])
        qpath, dpath = os.path.join(tmp, "bench_q.onnx"), os.path.join(tmp, "bench_d.onnx")
        onnx.save(m, qpath)
        g = h.make_graph([h.make_node("MatMul", ["x", "wf"], ["y"])], "dense",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, k])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, n])], [nh.from_array(dequantized, "wf")])
        dm = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
        dm.ir_version = 10
        onnx.save(dm, dpath)
        x = {"x": np.random.default_rng(0).uniform(-1, 1, size=(1, k)).astype(np.float32)}
        times = {}
        for label, path in [("qdq", qpath), ("float", dpath)]:
            s = mlx_session(path, devices)
            for _ in range(5):
                s.run(None, x)
            t = []
            for _ in range(50):
                t0 = time.perf_counter()
                s.run(None, x)
                t.append((time.perf_counter() - t0) * 1e3)
            times[label] = float(np.median(t))
        bits = 8 if wt == T.INT8 else 4
        print(f"{k}x{n} {'int8' if bits == 8 else 'uint4'} weight, one row: QDQ {times['qdq']:.3f} ms "
              f"({k * n * bits / 8 / 1e6:.1f} MB of weight) vs dequantized float {times['float']:.3f} ms "
              f"({k * n * 4 / 1e6:.1f} MB): {times['float'] / times['qdq']:.2f}x")


def main():
    # The quantized form is a GPU's (MLX's CPU backend dequantizes faster than it multiplies
    # quantized weights); on the CPU it is taken in the GPU's forms, which this sets for the
    # plugin loaded below and the child processes.
    os.environ["ONNXRUNTIME_EP_MLX_TEST_GPU_FORMS"] = "1"
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib:
        print("set ORT_MLX_EP_LIB to the built plugin", file=sys.stderr)
        return 2
    ort.register_execution_provider_library("MLX", lib)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    with tempfile.TemporaryDirectory() as tmp:
        if "--bench" in sys.argv:
            bench(devices, tmp)
            return 0
        failures = check(devices, tmp) + check_graph(tmp)
    print(f"QDQ weights: {len(CASES) + len(GEMM_CASES) + 2 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
