"""Checks the built plugin from Python, the way users load it: ONNX Runtime 1.31.1 from PyPI
registers the library, a session runs a graph with claimed and unclaimed nodes, ORT's own
assignment info must show which EP ran each node, and outputs must match the CPU EP's.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin."""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

EP = "MLXExecutionProvider"
results = []


def check(name, fn):
    try:
        fn()
        results.append((name, None))
        print(f"ok   {name}")
    except Exception as e:  # report every failure, then fail the run
        results.append((name, e))
        print(f"FAIL {name}: {e!r}")


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "check", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def mlx_session(model_bytes):
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    assert devices, f"no {EP} device after registering the plugin"
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    return ort.InferenceSession(model_bytes, so)


def cpu_session(model_bytes):
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def assigned(session):
    return {n.name: sg.ep_name for sg in session.get_provider_graph_assignment_info() for n in sg.get_nodes()}


def test_version():
    assert ort.__version__ == "1.31.1", ort.__version__


def test_mixed_graph():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    m = model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Cos", ["r"], ["c"], name="cos"),
            helper.make_node("Softmax", ["c"], ["y"], name="softmax", axis=-1),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(w, "W")],
    )
    s = mlx_session(m)
    a = assigned(s)
    assert a == {"mm": EP, "relu": EP, "cos": "CPUExecutionProvider", "softmax": EP}, a
    x = rng.standard_normal((4, 8)).astype(np.float32)
    got = s.run(None, {"x": x})[0]
    want = cpu_session(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    h = np.cos(np.maximum(x @ w, 0))
    ref = np.exp(h) / np.exp(h).sum(-1, keepdims=True)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_float16():
    m = model(
        [
            helper.make_node("Mul", ["a", "b"], ["p"], name="mul"),
            helper.make_node("Tanh", ["p"], ["y"], name="tanh"),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [3, 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 4])],
    )
    s = mlx_session(m)
    assert set(assigned(s).values()) == {EP}, assigned(s)
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal((3, 4)).astype(np.float16) for n in ("a", "b")}
    np.testing.assert_allclose(
        s.run(None, feed)[0].astype(np.float32), cpu_session(m).run(None, feed)[0].astype(np.float32), rtol=1e-2, atol=2e-3
    )


def main():
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib or not os.path.exists(lib):
        print(f"ORT_MLX_EP_LIB must point at the built plugin (got {lib!r})")
        return 2
    ort.register_execution_provider_library("MLX", lib)
    check("onnxruntime is the pinned 1.31.1", test_version)
    check("mixed graph: claimed nodes on MLX, Cos on CPU, outputs match", test_mixed_graph)
    check("float16 graph on MLX", test_float16)
    failed = sum(1 for _, e in results if e is not None)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
