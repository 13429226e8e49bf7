"""Runs the models of models.py on ORT's CPU EP and the MLX EP with the same random inputs.

    PY=target/mlx-ep/venv/bin/python
    $PY python/quant/compare.py [--noopt] [--bisect] [--repro] [GLOB...]
    ONNXRUNTIME_EP_MLX_COMPILE=0 $PY python/quant/compare.py ...      # eager MLX EP

GLOB filters file names under target/quant-models/ (default: all *.onnx but bisect copies).
--noopt     ORT_DISABLE_ALL graph optimizations on both sides.
--bisect    (optimizations on: on the model as ORT's basic optimizers rewrite it, saved under
            target/quant-models/opt/, run with optimizations off) for each model that disagrees: every intermediate value as a graph output (on a copy),
            one run on each EP, the first node (topological order) whose output differs.
--seq=N --tgt=N   encoder / decoder lengths (default 12 / 9; T5 bucket edges at |rel| 16, 32, 64)
--repro     with --bisect: write the first differing node alone (its actual inputs as .npy)
            under target/quant-models/repro/<model>/ and run it on both EPs.
"""

import fnmatch
import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "target", "quant-models")
LIB = os.environ.get("ORT_MLX_EP_LIB", os.path.join(ROOT, "target", "debug", "libonnxruntime_mlx_ep.so"))
EP = "MLXExecutionProvider"
RTOL, ATOL = 1e-4, 1e-3
ort.set_default_logger_severity(3)
_registered = False


def options(noopt):
    so = ort.SessionOptions()
    if noopt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def cpu_session(model, noopt=False):
    return ort.InferenceSession(model, options(noopt), providers=["CPUExecutionProvider"])


def mlx_session(model, noopt=False):
    global _registered
    if not _registered:
        ort.register_execution_provider_library("MLX", LIB)
        _registered = True
    so = options(noopt)
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP], {})
    return ort.InferenceSession(model, so)


def not_on_mlx(session):
    return [f"{n.op_type}:{n.name}@{sg.ep_name}" for sg in session.get_provider_graph_assignment_info()
            if sg.ep_name != EP for n in sg.get_nodes()]


SEQ, TGT = 12, 9


def make_inputs(session, seed=0, batch=2, vocab=100, d=64):
    seq, tgt = SEQ, TGT
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        n = tgt if i.name == "input_ids" and any(isinstance(s, str) and s == "tgt" for s in i.shape) else seq
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, vocab, (batch, n), dtype=np.int64)
        elif "mask" in i.name:
            m = np.ones((batch, seq), np.int64)
            m[1, seq - 3:] = 0  # padding on the second row
            feeds[i.name] = m
        else:
            feeds[i.name] = rng.standard_normal((batch, seq, d)).astype(np.float32)
    return feeds


def diff(a, b):
    """(max abs diff, count outside allclose / unequal, size)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), max(a.size, b.size), max(a.size, b.size)
    if a.size == 0:
        return 0.0, 0, 0
    if a.dtype.kind == "f":
        both = np.isfinite(a) & np.isfinite(b)
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        mad = float(d[both].max()) if both.any() else 0.0
        bad = ~np.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
        return mad, int(bad.sum()), a.size
    if a.dtype == np.bool_:
        return float((a != b).any()), int((a != b).sum()), a.size
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(d.max()), int((a != b).sum()), a.size


def compare(path, noopt):
    cpu, mlx = cpu_session(path, noopt), mlx_session(path, noopt)
    feeds = make_inputs(cpu)
    names = [o.name for o in cpu.get_outputs()]
    rc, rm = cpu.run(names, feeds), mlx.run(names, feeds)
    res = [(n, *diff(a, b)) for n, a, b in zip(names, rc, rm)]
    return res, not_on_mlx(mlx), feeds


# --- bisection -------------------------------------------------------------------------------


def with_all_outputs(model):
    """A copy of `model` with every node output (typed by shape inference) as a graph output."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    present = {o.name for o in m.graph.output}
    order = []
    for node in m.graph.node:
        for o in node.output:
            if o and o not in present and o in types:
                vi = onnx.ValueInfoProto()
                vi.CopyFrom(types[o])
                m.graph.output.append(vi)
                present.add(o)
            if o:
                order.append((node, o))
    return m, order


def basic_optimized(path):
    """The model as ORT's basic (level 1) optimizers leave it before partitioning, saved."""
    out = os.path.join(MODELS, "opt", os.path.basename(path)[: -len(".onnx")] + ".basic.onnx")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = out
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return out


def bisect(path, noopt, repro):
    if not noopt:
        # Intermediate outputs change what ORT's optimizers do: bisect the basic-optimized graph
        # (what the EP is given) with optimizations off on both sides.
        path, noopt = basic_optimized(path), True
        res, off, _ = compare(path, noopt)
        print(f"  basic-optimized {path} (opt off): " + "; ".join(f"{n}: max|d| {m:.4g}, {b}/{z}" for n, m, b, z in res))
    model = onnx.load(path)
    m, order = with_all_outputs(model)
    data = m.SerializeToString()
    cpu, mlx = cpu_session(data, noopt), mlx_session(data, noopt)
    feeds = make_inputs(cpu)
    outs = [o.name for o in m.graph.output]
    rc = dict(zip(outs, cpu.run(outs, feeds)))
    rm = dict(zip(outs, mlx.run(outs, feeds)))
    print(f"  bisect copy: {len(outs)} outputs, not on MLX: {not_on_mlx(mlx)}")
    shown, origins = 0, []
    for node, o in order:
        if o not in rc:
            continue
        mad, bad, size = diff(rc[o], rm[o])
        if bad:
            if shown < 8:
                print(f"  differs: {node.op_type:22s} {node.name:28s} -> {o}: max|d| {mad:.4g}, {bad}/{size}")
            shown += 1
            # An origin: a differing node none of whose runtime inputs differs (beyond allclose).
            if all(not i or i not in rc or not diff(rc[i], rm[i])[1] for i in node.input):
                if not origins or origins[-1] is not node:
                    origins.append(node)
    print(f"  {shown} differing intermediate values; origins (inputs agree, output differs): "
          f"{[f'{n.op_type}:{n.name}' for n in origins]}")
    for node in origins[:4]:
        describe(model, node, rc, rm, feeds)
        if repro:
            write_repro(model, node, rc, rm, feeds, path, noopt)


def value_of(name, model, rc, feeds):
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init), True
    if name in feeds:
        return feeds[name], False
    return rc[name], False


def describe(model, node, rc, rm, feeds):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    print(f"  FIRST: {node.op_type} {node.name} attrs={attrs}")
    for i, name in enumerate(node.input):
        if not name:
            continue
        v, const = value_of(name, model, rc, feeds)
        rng = f"[{v.min()}, {v.max()}]" if v.size else "[]"
        mlx_diff = "" if const or name in feeds else f" cpu-vs-mlx {diff(rc[name], rm[name])[:2]}"
        print(f"    in{i} {name}: {v.dtype}{list(v.shape)} {'const' if const else 'runtime'} range {rng}{mlx_diff}")
    for name in node.output:
        if name in rc:
            a, b = rc[name], rm[name]
            print(f"    out {name}: {a.dtype}{list(a.shape)} cpu range [{a.min()}, {a.max()}] "
                  f"mlx range [{b.min()}, {b.max()}] diff {diff(a, b)[:2]}")


def chain_of(model, node, rc, rm):
    """`node` and its ancestors back to values that are bit-identical on both EPs (or graph
    inputs / initializers): the smallest chain that carries the difference from where it
    starts (a 1-ulp difference inside allclose included)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    node = next(n for n in model.graph.node if n.name == node.name)
    keep, todo = {id(node): node}, [node]
    while todo:
        for i in todo.pop().input:
            p = producer.get(i)
            if p is None or id(p) in keep or i not in rc or diff(rc[i], rm[i])[0] == 0 and (
                    rc[i] == rm[i]).all():
                continue
            keep[id(p)] = p
            todo.append(p)
    return [n for n in model.graph.node if id(n) in keep]


def write_repro(model, node, rc, rm, feeds, path, noopt):
    nodes = chain_of(model, node, rc, rm)
    base = os.path.basename(path)[: -len(".onnx")]
    out = os.path.join(MODELS, "repro", base, safe(node.name))
    os.makedirs(out, exist_ok=True)
    made = {o for n in nodes for o in n.output}
    inputs, inits, rfeeds = [], [], {}
    for name in [i for n in nodes for i in n.input]:
        if not name or name in made or name in rfeeds or any(i.name == name for i in inits):
            continue
        v, const = value_of(name, model, rc, feeds)
        np.save(os.path.join(out, f"{safe(name)}.npy"), v)
        if const:
            inits.append(numpy_helper.from_array(v, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
            rfeeds[name] = v
    outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(rc[n].dtype), list(rc[n].shape))
               for n in node.output if n]
    g = helper.make_graph(nodes, "repro", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = 10
    mp = os.path.join(out, "chain.onnx")
    onnx.save(m, mp)
    cpu, mlx = cpu_session(mp, noopt), mlx_session(mp, noopt)
    names = [o.name for o in outputs]
    a, b = cpu.run(names, rfeeds), mlx.run(names, rfeeds)
    print(f"  repro chain {[f'{n.op_type}:{n.name}' for n in nodes]} -> {mp}")
    for n, x, y in zip(names, a, b):
        np.save(os.path.join(out, f"cpu_{safe(n)}.npy"), x)
        np.save(os.path.join(out, f"mlx_{safe(n)}.npy"), y)
        print(f"    {n}: cpu-vs-mlx {diff(x, y)[:2]} (same as in the model: cpu {diff(rc[n], x)[1] == 0}, "
              f"mlx {diff(rm[n], y)[1] == 0}); not on MLX: {not_on_mlx(mlx)}")


def safe(name):
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


def main():
    global SEQ, TGT
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    for a in sys.argv[1:]:
        if a.startswith("--seq="):
            SEQ = int(a[6:])
        if a.startswith("--tgt="):
            TGT = int(a[6:])
    noopt, do_bisect, repro = "--noopt" in sys.argv, "--bisect" in sys.argv, "--repro" in sys.argv
    files = sorted(glob.glob(os.path.join(MODELS, "*.onnx")))
    if args:
        files = [f for f in files if any(fnmatch.fnmatch(os.path.basename(f), a) for a in args)]
        files += [a for a in args if os.path.isfile(a)]
    mode = f"compile={os.environ.get('ONNXRUNTIME_EP_MLX_COMPILE', '1')} opt={'off' if noopt else 'on'}"
    print(f"# {mode} seq={SEQ} tgt={TGT} rtol={RTOL} atol={ATOL}")
    for f in files:
        res, off, _ = compare(f, noopt)
        bad = any(r[2] for r in res)
        s = "; ".join(f"{n}: max|d| {mad:.4g}, {b}/{size} outside" for n, mad, b, size in res)
        print(f"{'DIFF' if bad else 'ok  '} {os.path.basename(f):32s} {s}; not on MLX: {off}")
        sys.stdout.flush()
        if bad and do_bisect:
            bisect(f, noopt, repro)


if __name__ == "__main__":
    main()
