"""Dynamically quantized transformers, end to end: small T5-style encoders (gated-GELU and
ReLU feed-forward, run-time relative-position buckets, decomposed RMS norms), a BERT-style
encoder and a T5-style decoder with cross-attention (python/quant/models.py, random weights,
fixed seeds), each in float32 and quantized with `onnxruntime.quantization.quantize_dynamic`
(per-tensor and per-channel, uint8 and int8 weights, symmetric or not). Every node must run
on the MLX EP and every output must be allclose (rtol 1e-4, atol 1e-3) to ORT's CPU EP, at a
sequence length (20) where T5's buckets reach the log-spaced range. A quantized model may
differ by whole quantization steps only where a DynamicQuantizeLinear rounds a value lying
on a rounding tie (see `tie_flips`): that, and only that, is reported and accepted.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin.
`python check_quantized_models.py [NAME_SUBSTRING]` runs a subset."""

import logging
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant"))
import models  # noqa: E402  (python/quant/models.py)

EP = "MLXExecutionProvider"
RTOL, ATOL = 1e-4, 1e-3
SEQ, TGT, BATCH = 20, 9, 2


def feeds_for(session, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        n = TGT if i.name == "input_ids" and "tgt" in i.shape else SEQ
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, models.V, (BATCH, n), dtype=np.int64)
        elif "mask" in i.name:
            m = np.ones((BATCH, SEQ), np.int64)
            m[1, SEQ - 3:] = 0  # padding on the second row
            feeds[i.name] = m
        else:
            feeds[i.name] = rng.standard_normal((BATCH, SEQ, models.D)).astype(np.float32)
    return feeds


def mlx_session(path, devices, optimize=True):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    s = ort.InferenceSession(path, so)
    s.disable_fallback()
    return s


def tie_flips(path, devices, feeds):
    """Why the outputs differ, when they differ only because one DynamicQuantizeLinear rounded
    a value that lies on a rounding tie (x / scale within 1e-3 of k + 1/2) the other way: the
    EPs' float results upstream differ by an ulp or so (summation order, a libm), which no EP
    can promise away, and one code then flips. Finds the first DynamicQuantizeLinear (in graph
    order) whose codes differ on the two EPs, with every quantizer's input and outputs exposed,
    and checks that each differing code sits on a tie. Returns (explained, text)."""
    m = onnx.load(path)
    dql = [n for n in m.graph.node if n.op_type == "DynamicQuantizeLinear"]
    names = {o.name for o in m.graph.output}
    for n in dql:
        for v in [n.input[0], *n.output]:
            if v not in names:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(v))
                names.add(v)
    exposed = m.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    cpu = ort.InferenceSession(exposed, so, providers=["CPUExecutionProvider"])
    mlx = mlx_session(exposed, devices, optimize=False)
    outs = [o.name for o in cpu.get_outputs()]
    want = dict(zip(outs, cpu.run(None, feeds)))
    got = dict(zip(outs, mlx.run(None, feeds)))
    for n in dql:
        x, (y, scale, zp) = want[n.input[0]].astype(np.float64), n.output
        differ = want[y] != got[y]
        if not differ.any():
            continue
        t = x / float(want[scale]) + float(want[zp])
        off_tie = np.abs(t - np.floor(t) - 0.5) > 1e-3
        if (differ & off_tie).any():
            return False, f"'{n.name}' rounds {int((differ & off_tie).sum())} values that are not on a tie differently"
        return True, f"first flip: {int(differ.sum())} code(s) of '{n.name}', each on a rounding tie"
    return False, "no DynamicQuantizeLinear code differs, yet the outputs do"


def check(path, devices):
    """None when the model matches with every node on MLX, else what is wrong."""
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    mlx = mlx_session(path, devices)
    elsewhere = [f"{n.op_type} '{n.name}' on {sg.ep_name}" for sg in mlx.get_provider_graph_assignment_info()
                 if sg.ep_name != EP for n in sg.get_nodes()]
    if elsewhere:
        return f"not on the MLX EP: {elsewhere}"
    feeds = feeds_for(cpu)
    want, got = cpu.run(None, feeds), mlx.run(None, feeds)
    for w, g, out in zip(want, got, cpu.get_outputs()):
        if w.shape != g.shape:
            return f"output '{out.name}': shape {g.shape}, CPU EP {w.shape}"
        bad = ~np.isclose(g, w, rtol=RTOL, atol=ATOL)
        if bad.any():
            d = float(np.abs(g.astype(np.float64) - w).max())
            what = f"output '{out.name}': {int(bad.sum())} of {w.size} elements outside allclose, max abs diff {d:.3g}"
            explained, why = tie_flips(path, devices, feeds)
            if not explained:
                return f"{what}; {why}"
            print(f"     ({what}: {why})")
    return None


def main():
    from onnxruntime.quantization import quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    failures = passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in models.MODELS.items():
            fp = os.path.join(tmp, f"{name}.float.onnx")
            onnx.save(build(), fp)
            paths = {f"{name}.float": fp}
            for vname, kw in models.variants().items():
                if pick in f"{name}.{vname}":
                    paths[f"{name}.{vname}"] = os.path.join(tmp, f"{name}.{vname}.onnx")
                    quantize_dynamic(fp, paths[f"{name}.{vname}"], **kw)
            for label, path in paths.items():
                if pick not in label:
                    continue
                why = check(path, devices)
                if why:
                    failures += 1
                    print(f"FAIL {label}: {why}")
                else:
                    passed += 1
                    print(f"ok   {label}")
    print(f"{passed} passed, {failures} failed")
    return 1 if failures or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
