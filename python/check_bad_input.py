"""Bad input must never hurt the host: out-of-range indices fed to the gathers and scatters
(and the position ids of RotaryEmbedding) must fail the run with an error naming the node,
as ORT's CPU EP does, instead of reading or writing outside a tensor. Each case runs in a
child process (a crash there is a failure here, not the end of the check), on the MLX EP
with compiled graphs and eagerly, and is compared with the CPU EP.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin;
`python check_bad_input.py --child NAME` replays one case."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

EP = "MLXExecutionProvider"
BAD = {"4": 4, "-5": -5, "1e5": 100000, "2^40": 1 << 40}
DATA = np.arange(12, dtype=np.float32).reshape(4, 3) + 1.0


def model(node, inputs, outputs, opset=17, domain_opsets=()):
    graph = helper.make_graph([node], "bad_input", inputs, outputs)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domain_opsets]
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


F, I64 = TensorProto.FLOAT, TensorProto.INT64


def cases():
    """name -> (model bytes, feeds)."""
    out = {}
    for label, v in BAD.items():
        idx = np.array([v], dtype=np.int64)
        out[f"Gather[{label}]"] = (
            model(helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=0),
                  [vi("x", F, [4, 3]), vi("i", I64, [1])], [vi("y", F, [1, 3])]),
            {"x": DATA, "i": idx},
        )
        out[f"GatherElements[{label}]"] = (
            model(helper.make_node("GatherElements", ["x", "i"], ["y"], name="gather_elements", axis=0),
                  [vi("x", F, [4, 3]), vi("i", I64, [1, 3])], [vi("y", F, [1, 3])]),
            {"x": DATA, "i": np.array([[0, v, 1]], dtype=np.int64)},
        )
        out[f"GatherND[{label}]"] = (
            model(helper.make_node("GatherND", ["x", "i"], ["y"], name="gather_nd"),
                  [vi("x", F, [4, 3]), vi("i", I64, [2, 2])], [vi("y", F, [2])]),
            {"x": DATA, "i": np.array([[0, 1], [v, 0]], dtype=np.int64)},
        )
        out[f"ScatterElements[{label}]"] = (
            model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="scatter_elements", axis=0),
                  [vi("x", F, [4, 3]), vi("i", I64, [1, 3]), vi("u", F, [1, 3])], [vi("y", F, [4, 3])]),
            {"x": DATA, "i": np.array([[0, v, 1]], dtype=np.int64), "u": np.full((1, 3), 7.0, np.float32)},
        )
        out[f"ScatterND[{label}]"] = (
            model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="scatter_nd"),
                  [vi("x", F, [4, 3]), vi("i", I64, [1, 1]), vi("u", F, [1, 3])], [vi("y", F, [4, 3])]),
            {"x": DATA, "i": np.array([[v]], dtype=np.int64), "u": np.full((1, 3), 7.0, np.float32)},
        )
    # In range, negative included: the same answer as the CPU EP.
    out["Gather[valid]"] = (
        model(helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=0),
              [vi("x", F, [4, 3]), vi("i", I64, [3])], [vi("y", F, [3, 3])]),
        {"x": DATA, "i": np.array([0, -1, 3], dtype=np.int64)},
    )
    out["ScatterND[valid]"] = (
        model(helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="scatter_nd"),
              [vi("x", F, [4, 3]), vi("i", I64, [1, 1]), vi("u", F, [1, 3])], [vi("y", F, [4, 3])]),
        {"x": DATA, "i": np.array([[-4]], dtype=np.int64), "u": np.full((1, 3), 7.0, np.float32)},
    )
    # Position ids past the cos/sin caches.
    for label, p in {"past-end": 16, "negative": -1}.items():
        out[f"RotaryEmbedding[{label}]"] = (
            model(helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="rotary",
                                   domain="com.microsoft"),
                  [vi("x", F, [1, 2, 8]), vi("pos", I64, [1, 2]), vi("cos", F, [16, 4]), vi("sin", F, [16, 4])],
                  [vi("y", F, [1, 2, 8])], domain_opsets=[("com.microsoft", 1)]),
            {"x": np.ones((1, 2, 8), np.float32), "pos": np.array([[0, p]], dtype=np.int64),
             "cos": np.ones((16, 4), np.float32), "sin": np.zeros((16, 4), np.float32)},
        )
    return out


def run(session, feeds):
    try:
        return {"outputs": [o.tolist() for o in session.run(None, feeds)]}
    except Exception as e:  # the error is the answer under test
        return {"error": str(e)}


def child(name):
    """One case on the MLX EP (compilation as the environment says) and the CPU EP; prints JSON."""
    m, feeds = cases()[name]
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    mlx = ort.InferenceSession(m, so)
    # ORT's Python API would otherwise rerun a failed run on the CPU EP alone.
    mlx.disable_fallback()
    on = sorted({sg.ep_name for sg in mlx.get_provider_graph_assignment_info()})
    cpu = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    # Twice on MLX: the second run replays the compiled graph.
    print(json.dumps({"eps": on, "mlx": [run(mlx, feeds), run(mlx, feeds)], "cpu": run(cpu, feeds)}))
    return 0


def judge(name, compile_mode):
    env = dict(os.environ, ONNXRUNTIME_EP_MLX_COMPILE=compile_mode)
    p = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        return f"the host process died (exit {p.returncode}): {p.stderr.strip()[-400:]}"
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["eps"] != [EP]:
        return f"ran on {r['eps']}, not the MLX EP alone"
    cpu = r["cpu"]
    for got in r["mlx"]:
        if "error" in cpu:
            if "error" not in got:
                return f"MLX answered {got['outputs']} where the CPU EP raised: {cpu['error']}"
            if "out of range" not in got["error"] and "outside" not in got["error"]:
                return f"MLX's error does not say what is wrong: {got['error']}"
        elif "error" in got:
            return f"MLX raised where the CPU EP answered: {got['error']}"
        elif not all(np.allclose(np.array(a), np.array(b)) for a, b in zip(got["outputs"], cpu["outputs"])):
            return f"MLX answered {got['outputs']}, the CPU EP {cpu['outputs']}"
    return None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    failures = 0
    names = list(cases())
    for mode in ("1", "0"):
        for name in names:
            why = judge(name, mode)
            label = f"{name} ({'compiled' if mode == '1' else 'eager'})"
            if why:
                failures += 1
                print(f"FAIL {label}: {why}")
                print(f"     replay: ONNXRUNTIME_EP_MLX_COMPILE={mode} python {__file__} --child '{name}'")
            else:
                print(f"ok   {label}")
    total = 2 * len(names)
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
