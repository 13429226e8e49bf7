"""Soak and churn: the MLX EP run for long in one process, with memory sampled as it goes.

Three phases, each with two samples taken in the same run (never absolute numbers):
- runs: one session run RUNS times; RSS and MLX's active memory at the tenth of the way and
  at the end;
- cycles: CYCLES sessions created, run and destroyed one after another; samples at the tenth
  cycle and at the last;
- shapes: SHAPE_RUNS runs of one session cycling through SHAPES input shapes (more than the
  compiled-closure cache keeps, so closures are dropped and rebuilt); samples after the first
  quarter and at the end.
Each phase passes when RSS grew by at most TOLERANCE (a fraction) between its samples, MLX's
active memory by at most the same fraction, and MLX's buffer cache stayed within its limit.
Every answer is checked against ORT's CPU EP on the way.

`cargo xtask soak` runs it at full size (10,000 runs, 100 cycles, 2,000 runs over 50 shapes);
`cargo xtask test` runs it smaller (--short). ORT_MLX_EP_LIB names the plugin; MLX's figures
come from the plugin's own `OrtMlxEp_GetMemoryStats`.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

EP = "MLXExecutionProvider"
CACHE_LIMIT = 1 << 30  # the EP's default `cache_limit`


def model():
    """x [b, s, 16] -> MatMul, Add, Relu, Softmax (compiled per shape), ReduceMean -> [b, 16]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["p"], name="softmax", axis=-1),
        helper.make_node("ReduceMean", ["p", "axes"], ["y"], name="mean", keepdims=0),
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    g = helper.make_graph(
        nodes,
        "soak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])],
        [w, b, axes],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Mlx:
    """MLX's memory figures, read through the plugin's diagnostics entry."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        self.fn = self.lib.OrtMlxEp_GetMemoryStats
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.fn.restype = ctypes.c_size_t

    def stats(self):
        values = (ctypes.c_uint64 * 3)()
        n = self.fn(values, 3)
        if n != 3:
            raise RuntimeError(f"OrtMlxEp_GetMemoryStats wrote {n} of 3 figures")
        return {"active": values[0], "cache": values[1], "peak": values[2]}


def session(m):
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    s = ort.InferenceSession(m, so, enable_fallback=0)
    placed = {n.name: sg.ep_name for sg in s.get_provider_graph_assignment_info() for n in sg.get_nodes()}
    assert set(placed.values()) == {EP}, placed
    return s


class Phase:
    def __init__(self, name, mlx):
        self.name, self.mlx, self.samples = name, mlx, []

    def sample(self, at):
        self.samples.append({"at": at, "rss": rss_bytes(), **self.mlx.stats()})

    def verdict(self, tolerance):
        a, b = self.samples
        problems = []
        for key in ("rss", "active"):
            if b[key] > a[key] * (1 + tolerance) + (64 << 10):  # 64 KiB: allocator granularity
                problems.append(f"{key} grew {a[key]} -> {b[key]} bytes ({(b[key] / max(a[key], 1) - 1) * 100:.1f}%)")
        for s in self.samples:
            if s["cache"] > CACHE_LIMIT:
                problems.append(f"MLX's buffer cache held {s['cache']} bytes at {s['at']}, over {CACHE_LIMIT}")
        return problems


def check(outputs, expected, what):
    np.testing.assert_allclose(outputs[0], expected[0], rtol=1e-4, atol=1e-5, err_msg=what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--shape-runs", type=int, default=2000)
    ap.add_argument("--shapes", type=int, default=50)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--short", action="store_true", help="2,000 runs, 30 cycles, 1,000 runs over 50 shapes")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.short:
        args.runs, args.cycles, args.shape_runs = 2000, 30, 1000
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib:
        sys.exit("ORT_MLX_EP_LIB must name the plugin library")
    ort.register_execution_provider_library(EP, lib)
    mlx = Mlx(lib)
    m = model()
    cpu = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    phases, started = [], time.time()

    # One session, many runs of one shape.
    p = Phase(f"{args.runs} runs of one session", mlx)
    s = session(m)
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    want = cpu.run(None, {"x": x})
    for i in range(1, args.runs + 1):
        out = s.run(None, {"x": x})
        if i % 500 == 0 or i == 1:
            check(out, want, f"run {i}")
        if i in (args.runs // 10, args.runs):
            p.sample(f"run {i}")
    del s
    phases.append(p)

    # Sessions created, run and destroyed.
    p = Phase(f"{args.cycles} session cycles", mlx)
    for c in range(1, args.cycles + 1):
        s = session(m)
        for _ in range(3):
            out = s.run(None, {"x": x})
        check(out, want, f"cycle {c}")
        del s
        if c in (max(args.cycles // 10, 1), args.cycles):
            p.sample(f"cycle {c}")
    phases.append(p)

    # One session over more shapes than it keeps compiled.
    p = Phase(f"{args.shape_runs} runs over {args.shapes} shapes", mlx)
    shapes = [(1 + k % 5, 1 + k // 5) for k in range(args.shapes)]
    feeds = [rng.standard_normal((bb, ss, 16)).astype(np.float32) for bb, ss in shapes]
    wants = [cpu.run(None, {"x": f}) for f in feeds]
    s = session(m)
    for i in range(1, args.shape_runs + 1):
        k = (i - 1) % len(feeds)
        out = s.run(None, {"x": feeds[k]})
        if i <= len(feeds) or i % 97 == 0:
            check(out, wants[k], f"run {i} (shape {shapes[k]})")
        if i in (args.shape_runs // 4, args.shape_runs):
            p.sample(f"run {i}")
    del s
    phases.append(p)

    failed = []
    print(f"soak: {time.time() - started:.1f} s; RSS and MLX memory (bytes) at two points of each phase:")
    for p in phases:
        problems = p.verdict(args.tolerance)
        a, b = p.samples
        print(
            f"  {'ok  ' if not problems else 'FAIL'} {p.name}: RSS {a['rss']} -> {b['rss']} "
            f"({(b['rss'] / a['rss'] - 1) * 100:+.2f}%), MLX active {a['active']} -> {b['active']}, "
            f"cache {a['cache']} -> {b['cache']}, peak {b['peak']}"
        )
        for problem in problems:
            print(f"       {problem}")
        failed += [f"{p.name}: {q}" for q in problems]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tolerance": args.tolerance, "phases": [{"name": p.name, "samples": p.samples} for p in phases]}, f, indent=1)
    if failed:
        sys.exit(f"soak: {len(failed)} problem(s)")
    print("soak: memory flat within the tolerance in every phase")


if __name__ == "__main__":
    main()
