"""ONNX's float4e2m1 Q/DQ forms (opset 23), which ORT 1.31's CPU EP has no kernel for: a model
holding them runs only where an EP takes them. Checked here against the `onnx` package's
reference evaluator, which computes them from the specification:

- `x @ DequantizeLinear(w)` with `w` a float4 constant (per tensor, per column, in blocks along
  K), float32 and float16 outputs: allclose to the reference (the product sums in another
  order);
- `DequantizeLinear(QuantizeLinear(x))` through float4 (per tensor, per axis, blocked, with a
  zero point, float32 and float16 inputs, values on every rounding tie, past the largest
  value, infinities and NaN): bit for bit equal to the reference.

Every node must run on the MLX EP (ORT's assignment info). Run by `cargo xtask test` with
ORT_MLX_EP_LIB pointing at the built plugin."""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

EP = "MLXExecutionProvider"
# The float4e2m1 values of codes 0..15.
VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
NP = {T.FLOAT: np.float32, T.FLOAT16: np.float16}


def model(nodes, inputs, outputs, inits, opset=23):
    g = h.make_graph(nodes, "float4", inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 11
    onnx.checker.check_model(m)
    return m


def scale_of(layout, shape, axis, rng):
    """Scales for `layout`: "tensor" (a scalar), "axis" (one per index of `axis`) or a block
    size along `axis`."""
    if layout == "tensor":
        return rng.uniform(0.5, 2.0, []).astype(np.float32), {}
    if layout == "axis":
        return rng.uniform(0.5, 2.0, [shape[axis]]).astype(np.float32), {"axis": axis}
    sshape = list(shape)
    sshape[axis] = -(-shape[axis] // layout)
    return rng.uniform(0.5, 2.0, sshape).astype(np.float32), {"axis": axis, "block_size": layout}


def dequantize_matmul(layout, k, n, out_type, rows, seed):
    rng = np.random.default_rng(seed)
    w = VALUES[rng.integers(0, 16, [k, n])]
    scale, attrs = scale_of(layout, [k, n], 0 if isinstance(layout, int) else 1, rng)
    inits = [h.make_tensor("w", T.FLOAT4E2M1, [k, n], w.ravel().tolist()), h.make_tensor("s", out_type, scale.shape, scale.astype(NP[out_type]).ravel().tolist())]
    nodes = [h.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq", **attrs), h.make_node("MatMul", ["x", "wf"], ["y"], name="mm")]
    m = model(nodes, [h.make_tensor_value_info("x", out_type, [rows, k])], [h.make_tensor_value_info("y", out_type, [rows, n])], inits)
    x = rng.uniform(-1, 1, [rows, k]).astype(NP[out_type])
    return m, {"x": x}, 1e-4 if out_type == T.FLOAT else 2e-2


def round_trip(layout, shape, axis, in_type, zero, seed, scale_type=T.FLOAT, precision=None):
    rng = np.random.default_rng(seed)
    scale, attrs = scale_of(layout, shape, axis, rng)
    scale = scale.astype(NP[scale_type])
    # Values on every midpoint and tie, past 6, infinities, NaN, tiny ones, in units of the scale.
    special = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 0.26, 5.01, 7, 100, np.inf, -np.inf, np.nan, -0.0, 1e-30], np.float32)
    units = rng.uniform(-8, 8, shape).astype(np.float32)
    flat = units.ravel()
    picks = rng.integers(0, len(special), flat.size // 2)
    where = rng.choice(flat.size, flat.size // 2, replace=False)
    flat[where] = special[picks] * np.where(rng.random(len(picks)) < 0.5, -1, 1)
    full_scale = ReferenceEvaluator(
        model([h.make_node("DequantizeLinear", ["q", "s"], ["y"], **attrs)], [], [h.make_tensor_value_info("y", T.FLOAT, shape)], [h.make_tensor("q", T.UINT8, shape, np.ones(shape, np.uint8).ravel().tolist()), h.make_tensor("s", T.FLOAT, scale.shape, scale.astype(np.float32).ravel().tolist())])
    ).run(None, {})[0]
    x = (flat.reshape(shape) * full_scale).astype(NP[in_type])
    zp_values = np.full(scale.shape, zero, np.float32)
    inits = [h.make_tensor("s", scale_type, scale.shape, scale.ravel().tolist()), h.make_tensor("zp", T.FLOAT4E2M1, scale.shape, zp_values.ravel().tolist())]
    q_attrs = dict(attrs, **({} if precision is None else {"precision": precision}))
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q", **q_attrs), h.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq", **attrs)]
    m = model(nodes, [h.make_tensor_value_info("x", in_type, shape)], [h.make_tensor_value_info("y", scale_type, shape)], inits, opset=23 if precision is None else 25)
    return m, {"x": x}, 0.0


def mlx_session(m):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP], {})
    return ort.InferenceSession(m.SerializeToString(), so)


def main():
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    cases = []
    for i, (layout, k, n, t, rows) in enumerate(
        [("tensor", 64, 24, T.FLOAT, 3), ("axis", 96, 40, T.FLOAT, 1), (32, 128, 48, T.FLOAT, 4), (16, 40, 8, T.FLOAT, 2), ("axis", 64, 32, T.FLOAT16, 3), (32, 64, 16, T.FLOAT16, 1)]
    ):
        cases.append((f"x @ DequantizeLinear(float4 w [{k}, {n}]), scale {layout}, {'float16' if t == T.FLOAT16 else 'float32'}", dequantize_matmul(layout, k, n, t, rows, i)))
    name = {T.FLOAT: "float32", T.FLOAT16: "float16"}
    for i, (layout, shape, axis, t, zero, st, precision) in enumerate(
        [
            ("tensor", [257], 0, T.FLOAT, 0.0, T.FLOAT, None),
            ("axis", [6, 40], 0, T.FLOAT, 0.0, T.FLOAT, None),
            ("axis", [3, 5, 16], 2, T.FLOAT, 1.0, T.FLOAT, None),
            (8, [4, 30], 1, T.FLOAT, 0.0, T.FLOAT, None),
            (16, [33, 5], 0, T.FLOAT16, -0.5, T.FLOAT, None),
            ("tensor", [7, 9], 0, T.FLOAT16, 0.0, T.FLOAT, None),
            # float16 x and scale: the quotient in float16; opset 25's precision asks float32.
            ("axis", [5, 64], 1, T.FLOAT16, 0.0, T.FLOAT16, None),
            (16, [6, 48], 1, T.FLOAT16, 0.0, T.FLOAT16, T.FLOAT),
            ("tensor", [300], 0, T.FLOAT, 0.0, T.FLOAT, T.FLOAT16),
        ]
    ):
        what = f"QuantizeLinear -> float4 -> DequantizeLinear {shape}, scale {layout} (axis {axis}), zero point {zero}, {name[t]} x, {name[st]} scale"
        what += "" if precision is None else f", precision {name[precision]}"
        cases.append((what, round_trip(layout, shape, axis, t, zero, 100 + i, st, precision)))
    failures = 0
    for name, (m, feeds, tol) in cases:
        want = ReferenceEvaluator(m).run(None, feeds)[0]
        s = mlx_session(m)
        placed = {n.name: sg.ep_name for sg in s.get_provider_graph_assignment_info() for n in sg.get_nodes()}
        off = [n for n, ep in placed.items() if ep != EP]
        got = s.run(None, feeds)[0]
        if off:
            ok, why = False, f"nodes not on the MLX EP: {off}"
        elif got.shape != want.shape or got.dtype != want.dtype:
            ok, why = False, f"{got.dtype}{got.shape} vs the reference's {want.dtype}{want.shape}"
        elif tol == 0.0:
            bits = f"u{got.itemsize}"
            same = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))
            ok, why = bool(same.all()), f"{int((~same).sum())} of {got.size} values differ, e.g. {got[~same][:4]} vs {want[~same][:4]}"
        else:
            ok = bool(np.allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol))
            why = f"max difference {np.abs(got.astype(np.float32) - want.astype(np.float32)).max():.3g}"
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {why}"))
        failures += not ok
    print(f"{len(cases) - failures}/{len(cases)} float4 Q/DQ cases match the onnx reference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
