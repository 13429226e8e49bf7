"""Concurrent runs stay correct: one MLX session driven by 4 threads, 4 sessions on 4 threads,
and sessions created and destroyed while others run; every answer must equal the CPU EP's
for the same input, and the whole check must finish (a deadlock fails it by timeout).

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin."""

import os
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

EP = "MLXExecutionProvider"
THREADS, RUNS = 4, 40


def model():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("ReduceSum", ["t"], ["y"], name="sum", keepdims=0),
    ]
    g = helper.make_graph(nodes, "concurrency", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def mlx_session(m, devices):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    s = ort.InferenceSession(m, so)
    s.disable_fallback()
    placed = {n.name: sg.ep_name for sg in s.get_provider_graph_assignment_info() for n in sg.get_nodes()}
    assert set(placed.values()) == {EP}, placed
    return s


def inputs(k):
    """Input `k`: its own values and, every third one, its own row count (a new shape)."""
    rng = np.random.default_rng(1000 + k)
    return rng.standard_normal((1 + k % 3, 16)).astype(np.float32)


def drive(session, expected, thread, errors):
    try:
        for r in range(RUNS):
            k = (thread * RUNS + r) % len(expected)
            got = session.run(None, {"x": inputs(k)})[0]
            if not np.allclose(got, expected[k], rtol=1e-5, atol=1e-5):
                errors.append(f"thread {thread} run {r}: {got} vs CPU {expected[k]}")
                return
    except Exception as e:  # reported with the other failures
        errors.append(f"thread {thread}: {e!r}")


def run_threads(targets):
    errors = []
    threads = [threading.Thread(target=t, args=(errors,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        if t.is_alive():
            errors.append("a thread did not finish within 300 s (deadlock?)")
    return errors


def main():
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    m = model()
    cpu = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    expected = [cpu.run(None, {"x": inputs(k)})[0] for k in range(3 * THREADS)]
    failures = []

    one = mlx_session(m, devices)
    errs = run_threads([lambda e, t=t: drive(one, expected, t, e) for t in range(THREADS)])
    failures += [f"one session, {THREADS} threads: {e}" for e in errs]
    print(f"{'ok  ' if not errs else 'FAIL'} one session on {THREADS} threads, {THREADS * RUNS} runs")

    sessions = [mlx_session(m, devices) for _ in range(THREADS)]
    errs = run_threads([lambda e, t=t: drive(sessions[t], expected, t, e) for t in range(THREADS)])
    failures += [f"{THREADS} sessions: {e}" for e in errs]
    print(f"{'ok  ' if not errs else 'FAIL'} {THREADS} sessions on {THREADS} threads, {THREADS * RUNS} runs")

    def churn(errors):
        try:
            for _ in range(10):
                s = mlx_session(m, devices)
                got = s.run(None, {"x": inputs(0)})[0]
                if not np.allclose(got, expected[0], rtol=1e-5, atol=1e-5):
                    errors.append(f"a fresh session answered {got}, CPU {expected[0]}")
                del s
        except Exception as e:
            errors.append(repr(e))

    errs = run_threads([lambda e, t=t: drive(one, expected, t, e) for t in range(THREADS - 1)] + [churn])
    failures += [f"sessions created and destroyed while others run: {e}" for e in errs]
    print(f"{'ok  ' if not errs else 'FAIL'} sessions created and destroyed while {THREADS - 1} threads run")

    for f in failures:
        print(f"FAIL {f}")
    print(f"{3 - len({f.split(':')[0] for f in failures})} passed, {len({f.split(':')[0] for f in failures})} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
