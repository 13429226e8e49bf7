"""The ONNX backend node tests against the MLX EP.

The `onnx` wheel no longer ships the node tests' data; its own case generators produce it
(`onnx.backend.test.case.node.collect_testcases`). Each case's model is written to
`target/onnx-node-tests/<test>/model.onnx` (replay one with `cargo xtask run`), then run on a
session with the MLX EP and on ORT's CPU EP. Per test this records which part of its nodes the
MLX EP ran (`all`, `some`, `none`, from ORT's assignment info) and whether the MLX session's
outputs match the expected ones (`pass`, `fail`, `error`). Tests ORT 1.31 itself cannot load
are counted as skipped.

The model suites the wheel still ships (`onnx/backend/test/data/{light,simple,pytorch-converted,
pytorch-operator}`) run too, recorded as `<suite>/<test>`: `simple` and `pytorch-*` against their
stored outputs, `light` (real networks with their weights, no data sets) against ORT's CPU EP
on seeded random inputs.

Usage: node_suite.py --out-json PATH [--report PATH] [--passing PATH] [--check-passing PATH]
                     [--property-json PATH] [--report-only] [--only NAMES]
  --report PATH         write the per-op Markdown report
  --passing PATH        rewrite the list of tests that are claimed (all/some) and pass (refused
                        when a test already listed there fails)
  --check-passing PATH  fail when a test listed in PATH no longer passes
"""

import argparse
import collections
import json
import os
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

EP = "MLXExecutionProvider"


def value_matches(g, w, rtol, atol):
    if isinstance(w, (list, tuple)):  # a sequence output
        return isinstance(g, (list, tuple)) and len(g) == len(w) and all(value_matches(a, b, rtol, atol) for a, b in zip(g, w))
    if w is None or g is None:  # an empty optional
        return g is None and w is None
    g, w = np.asarray(g), np.asarray(w)
    if g.shape != w.shape or g.dtype != w.dtype:
        return False
    if onnx_only(w.dtype):  # bfloat16, float8: compared as the float32 values they hold
        if w.dtype.name == "bfloat16":
            # The tests' rtol (1e-3) is finer than bfloat16's resolution (2^-8 relative), and
            # their references round every step to bfloat16 (test_attention_4d_causal_bf16's
            # is 2 units in the last place from the exact answer, which the MLX EP rounds
            # correctly): the property suite's bfloat16 rtol, 4 units.
            rtol = max(rtol, 2.0**-6)
        g, w = g.astype(np.float32), w.astype(np.float32)
    if w.dtype.kind in "fc":
        return bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    return bool(np.array_equal(g, w))


def outputs_match(got, want, rtol, atol, random=False):
    want = [feed_value(w) for w in want]
    if random:
        return len(got) == len(want) and all(sample_matches(g, w) for g, w in zip(got, want))
    return len(got) == len(want) and all(value_matches(g, w, rtol, atol) for g, w in zip(got, want))


# Random generators: no runtime draws the values a test recorded, so their outputs are compared
# by shape, type and support (finite; Bernoulli's 0 and 1).
RANDOM_OPS = {"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}


# Why the claimed tests that fail do (each fails on ORT's CPU EP too).
FAILING_WHY = {
    "test_dft_inverse": "the test asks 1e-7 absolute (rtol 1e-3) of bins that cancel to about 1.9e-7, "
    "where a float32 transform of inputs of order 1 rounds at about 1e-6: the MLX EP is within 4e-6 of a "
    "float64 inverse FFT everywhere, and ORT's float32 sum misses the same bins",
    "test_maxunpool_export_with_output_shape": "with `output_shape` the reference scatters the indices into "
    "the inferred 4x4 shape and pads it to 5x5; ORT's CPU EP (and PyTorch's max_unpool, which the test "
    "was exported from) read them as linear indices into the 5x5 output, as the op's text defines them; "
    "the MLX EP follows ORT",
}
FAILING_WHY["test_dft_inverse_opset19"] = FAILING_WHY["test_dft_inverse"]


def dropout_matches(inputs, got, want):
    """Dropout in training mode (the `test_training_dropout*` tests): the mask is a draw, so the
    output is checked to be the kept inputs times 1 / (1 - ratio) and 0 elsewhere, the mask (or,
    without one, the nonzero outputs) to keep about 1 - ratio of the elements (within five
    standard errors; all of them at ratio 0)."""
    x, ratio = np.asarray(feed_value(inputs[0])), float(np.asarray(feed_value(inputs[1])))
    if len(got) != len(want):
        return False
    y = np.asarray(got[0])
    if y.shape != x.shape or y.dtype != np.asarray(want[0]).dtype:
        return False
    if len(got) > 1:
        kept = np.asarray(got[1])
        if kept.shape != x.shape or kept.dtype != np.bool_:
            return False
    else:
        kept = y != 0
    if not np.allclose(y, np.where(kept, x / (1.0 - ratio), 0), rtol=1e-6, atol=0):
        return False
    n, p = x.size, 1.0 - ratio
    return abs(int(kept.sum()) - n * p) <= 5 * np.sqrt(n * p * (1 - p))


def case_matches(case, inputs, got, expected, random):
    if case.name.startswith("test_training_dropout"):
        return dropout_matches(inputs, got, [feed_value(w) for w in expected])
    return outputs_match(got, expected, case.rtol, case.atol, random)


def sample_matches(g, w):
    g, w = np.asarray(g), np.asarray(w)
    if g.shape != w.shape or g.dtype != w.dtype:
        return False
    if g.dtype.kind in "fc" and not np.all(np.isfinite(g)):
        return False
    return bool(np.all(np.isin(g, [0, 1]))) if np.all(np.isin(w, [0, 1])) else True


def feed_value(v):
    """The generators give some inputs as numpy scalars; sessions take arrays (or lists)."""
    if isinstance(v, onnx.TensorProto):
        return onnx.numpy_helper.to_array(v)
    return np.asarray(v) if isinstance(v, np.generic) else v


def onnx_only(dtype):
    """Element types NumPy holds only through ml_dtypes (bfloat16, float8): ORT's Python API
    takes and gives them only as OrtValues of raw bytes."""
    return dtype.type.__module__.startswith("ml_dtypes")


# ml_dtypes types ORT takes as OrtValues, by the raw unsigned type of their width: the 4-bit
# ones (packed two to a byte in ONNX, one to a byte in NumPy) are left out.
RAW = {1: np.uint8, 2: np.uint16}


def raw_value(a):
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize not in RAW or a.dtype.name.endswith(("int4", "int2", "float4_e2m1fn")):
        raise TypeError(f"{a.dtype} values cannot go through ORT's Python API")
    elem = onnx.helper.np_dtype_to_tensor_dtype(a.dtype)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(RAW[a.dtype.itemsize]), elem)


def run_session(s, inputs, expected):
    """One run of `s` on a test's inputs: through `run` for NumPy's own types, else through an
    IO binding whose bfloat16 / float8 inputs and outputs are raw-byte OrtValues (the outputs
    preallocated at the expected shapes)."""
    names = [i.name for i in s.get_inputs()]
    values = [feed_value(v) for v in inputs]
    expected = [feed_value(w) for w in expected]
    special = lambda v: isinstance(v, np.ndarray) and onnx_only(v.dtype)
    if not any(special(v) for v in values) and not any(special(np.asarray(w)) for w in expected if w is not None and not isinstance(w, (list, tuple))):
        return s.run(None, dict(zip(names, values)))
    io = s.io_binding()
    # The OrtValues share their arrays' memory: both are kept until the run is done.
    kept = []
    for n, v in zip(names, values):
        a = np.ascontiguousarray(v)
        value = raw_value(a) if special(a) else ort.OrtValue.ortvalue_from_numpy(a)
        kept.append((a, value))
        io.bind_ortvalue_input(n, value)
    buffers = []
    for o, w in zip(s.get_outputs(), expected):
        w = np.asarray(w)
        if onnx_only(w.dtype):
            buf = np.zeros(w.shape, dtype=w.dtype)
            io.bind_ortvalue_output(o.name, raw_value(buf))
            buffers.append(buf)
        else:
            io.bind_output(o.name, "cpu")
            buffers.append(None)
    # The raw OrtValues share the buffers' memory (both host, contiguous): the run writes them.
    s.run_with_iobinding(io)
    return [v.numpy() if b is None else b for v, b in zip(io.get_outputs(), buffers)]


def unfeedable(case):
    """Why ORT's Python API cannot take a test's inputs or give its outputs, or None."""
    for inputs, outputs in case.data_sets:
        for v in list(inputs) + [w for w in outputs if w is not None and not isinstance(w, (list, tuple))]:
            v = feed_value(v)
            if isinstance(v, np.ndarray) and onnx_only(v.dtype):
                try:
                    raw_value(v)
                except TypeError as e:
                    return str(e)
    return None


def session(model_bytes, mlx):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if mlx:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == EP], {})
        s = ort.InferenceSession(model_bytes, so)
        # A failed run counts as failed, not retried on ORT's CPU EP (the Python API's default).
        s.disable_fallback()
        return s
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def run_case(case, out_dir, op_of):
    model = case.model
    model_bytes = model.SerializeToString()
    case_dir = os.path.join(out_dir, case.name)
    os.makedirs(case_dir, exist_ok=True)
    with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
        f.write(model_bytes)
    op, domain = op_of.get(case.name.split("_expanded")[0], ("?", ""))
    record = {"test": case.name, "op": op, "domain": domain}
    random = not domain and op in RANDOM_OPS
    reason = unfeedable(case)
    if reason:
        record.update(claimed="none", result="skipped", reason=reason)
        return record
    try:
        cpu = session(model_bytes, mlx=False)
    except Exception as e:
        cpu, cpu_error = None, str(e).splitlines()[0][:200]
    # Whether ORT's CPU EP itself matches the expected outputs: a test it fails says nothing
    # about the MLX EP.
    try:
        if cpu is None:
            raise RuntimeError(cpu_error)
        record["cpu"] = "pass" if all(
            case_matches(case, inputs, run_session(cpu, inputs, expected), expected, random)
            for inputs, expected in case.data_sets
        ) else "fail"
    except Exception:
        record["cpu"] = "error"
    try:
        s = session(model_bytes, mlx=True)
    except Exception as e:
        if cpu is None:  # ORT itself cannot load it (IR/opset too new, unsupported type)
            record.update(claimed="none", result="skipped", reason=cpu_error)
            return record
        record.update(claimed="none", result="error", reason=str(e).splitlines()[0][:300])
        return record
    # A model ORT's CPU EP cannot load (a kernel that refuses an attribute, such as the
    # recurrent ops' batch-major layout) still counts when the MLX EP runs all of it.
    try:
        eps = [sg.ep_name for sg in s.get_provider_graph_assignment_info() for _ in sg.get_nodes()]
        on_mlx = sum(1 for e in eps if e == EP)
        record["claimed"] = "none" if on_mlx == 0 else ("all" if on_mlx == len(eps) else "some")
        passed = True
        for inputs, expected in case.data_sets:
            got = run_session(s, inputs, expected)
            passed &= case_matches(case, inputs, got, expected, random)
        record["result"] = "pass" if passed else "fail"
    except Exception as e:
        record.setdefault("claimed", "none")
        record.update(result="error", reason=str(e).splitlines()[0][:300])
    return record


MODEL_SUITES = ("light", "simple", "pytorch-converted", "pytorch-operator")


def random_feed(sess, seed):
    rng = np.random.default_rng(seed)
    feed = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if "float" in i.type:
            dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}[i.type]
            feed[i.name] = rng.standard_normal(shape).astype(dtype)
        elif "int64" in i.type:
            feed[i.name] = rng.integers(0, 4, shape).astype(np.int64)
        else:
            raise ValueError(f"input {i.name} of type {i.type} is not generated")
    return feed


def run_model_test(suite, name, model_path, data_sets):
    """One model-suite test: `data_sets` are (inputs, outputs) lists, or None for random inputs
    checked against ORT's CPU EP."""
    from onnx import numpy_helper

    record = {"test": f"{suite}/{name}", "op": f"({suite} models)", "domain": "", "suite": suite}
    started = time.time()
    with open(model_path, "rb") as f:
        model_bytes = f.read()
    try:
        cpu = session(model_bytes, mlx=False)
    except Exception as e:
        record.update(claimed="none", result="skipped", reason=str(e).splitlines()[0][:200])
        return record
    try:
        s = session(model_bytes, mlx=True)
        eps = [sg.ep_name for sg in s.get_provider_graph_assignment_info() for _ in sg.get_nodes()]
        on_mlx = sum(1 for e in eps if e == EP)
        record["claimed"] = "none" if on_mlx == 0 else ("all" if on_mlx == len(eps) else "some")
        if data_sets is None:
            feed = random_feed(cpu, 0)
            want = cpu.run(None, feed)
            record["cpu"] = "pass"
            ok = outputs_match(s.run(None, feed), want, 1e-3, 1e-4)
        else:
            ok, cpu_ok = True, True
            names = [i.name for i in s.get_inputs()]
            for inputs, outputs in data_sets:
                feed = {n: numpy_helper.to_array(t) for n, t in zip(names, inputs)}
                want = [numpy_helper.to_array(t) for t in outputs]
                ok &= outputs_match(s.run(None, feed), want, 1e-3, 1e-7)
                cpu_ok &= outputs_match(cpu.run(None, feed), want, 1e-3, 1e-7)
            record["cpu"] = "pass" if cpu_ok else "fail"
        record["result"] = "pass" if ok else "fail"
    except Exception as e:
        record.setdefault("claimed", "none")
        record.update(result="error", reason=str(e).splitlines()[0][:300])
    record["seconds"] = round(time.time() - started, 2)
    return record


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t


def model_suite_records():
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    records = []
    for suite in MODEL_SUITES:
        folder = os.path.join(root, suite)
        if not os.path.isdir(folder):
            continue
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if suite == "light":
                if entry.endswith(".onnx"):
                    records.append(run_model_test(suite, entry[: -len(".onnx")], path, None))
                continue
            data_sets = []
            for ds in sorted(d for d in os.listdir(path) if d.startswith("test_data_set")):
                ds_path = os.path.join(path, ds)
                files = sorted(os.listdir(ds_path))
                ins = [read_pb(os.path.join(ds_path, f)) for f in files if f.startswith("input_")]
                outs = [read_pb(os.path.join(ds_path, f)) for f in files if f.startswith("output_")]
                data_sets.append((ins, outs))
            records.append(run_model_test(suite, entry, os.path.join(path, "model.onnx"), data_sets))
    return records


TOLERANCES = """| element type | atol | rtol |
|---|---|---|
| float32 | 1e-5 | 1e-5 |
| float16 | 1e-3 | 2e-3 |
| bfloat16 | 8e-3 | 1.6e-2 |
| float64 | 1e-12 | 1e-12 |
| integers, bool | exact | exact |
"""


def property_section(path):
    """The property suite's per-op, per-dtype table from `mlx-ep-conformance --json`."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f).get("property", [])
    ops = {(r["domain"], r["op"]) for r in rows if r["op"] != "chain"}
    cases = sum(r["cases"] for r in rows)
    passed = sum(r["passed"] for r in rows)
    lines = [
        "## Property suite (generated cases against ORT's CPU EP)",
        "",
        "`cargo xtask conformance --cases N` draws N cases per registered lowering from the spec",
        "registered next to it (shapes with broadcasting, scalars, size-0 and size-1 dims, negative",
        "axes, attributes, special values), runs each as a model on the CPU EP and on the MLX EP,",
        "asserts through ORT's assignment info that the MLX EP ran every node, and compares. `chain`",
        "rows are multi-node cases (elementwise ops around a Reshape, an intermediate also a graph",
        "output). Ops ORT runs on CUDA only (no CPU kernel: BiasAdd, BiasSoftmax, BiasSplitGelu,",
        "GroupNorm, SkipGroupNorm, NhwcConv) are compared with a reference graph of standard ops",
        "their spec writes from the op's definition, which the CPU EP runs (so are MoE's float16",
        "cases, whose CPU kernel answers zeros). Random generators' outputs are compared as",
        "distributions (shapes, types, means and spreads). A value passes when",
        "`|mlx - cpu| <= atol` or `<= rtol * max(|mlx|, |cpu|)`; NaN matches NaN; shapes and",
        "element types must be equal:",
        "",
        TOLERANCES,
        f"Last run: {len(ops)} ops, {cases} cases, {passed} passed.",
        "",
        "| op | dtype | cases | passed | declined | failed | max abs err | max rel err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        op = f"{r['domain']}:{r['op']}" if r["domain"] else r["op"]
        lines.append(
            f"| {op} | {r['dtype']} | {r['cases']} | {r['passed']} | {r['declined']} | {r['failed']} "
            f"| {r['max_abs_err']:.2e} | {r['max_rel_err']:.2e} |"
        )
    return lines + [""]


def report(records, property_json=None):
    per_op = collections.OrderedDict()
    for r in sorted(records, key=lambda r: (r["domain"], r["op"])):
        key = f"{r['domain']}:{r['op']}" if r["domain"] else r["op"]
        c = per_op.setdefault(key, collections.Counter())
        c["tests"] += 1
        if r["result"] == "skipped":
            c["skipped"] += 1
            continue
        if r["claimed"] != "none":
            c["claimed"] += 1
            c["passed" if r["result"] == "pass" else "failed"] += 1
            if r["claimed"] == "all" and r["result"] == "pass":
                c["all_passed"] += 1
            if r["result"] != "pass" and r.get("cpu") != "pass":
                c["cpu_failed"] += 1
    lines = [
        "# Conformance",
        "",
        "Generated by `cargo xtask conformance --node-tests` (python/node_suite.py). Do not edit.",
        "",
    ]
    lines += property_section(property_json)
    lines += [
        "## ONNX backend node tests and model suites",
        "",
        f"From the `onnx` {onnx.__version__} wheel's case generators and shipped model suites, run with",
        f"ONNX Runtime {ort.__version__}. A test counts as *claimed* when the MLX EP ran some or all of",
        "its nodes (ORT's assignment info; `_expanded` tests are function bodies expanded into",
        "primitive ops), *fully claimed* when it ran all of them; *passed* and *failed* count claimed",
        "tests whose outputs match the expected ones or not, with each test's own tolerance",
        "(model suites: rtol 1e-3; `light` models against ORT's CPU EP on random inputs; random",
        "generators' tests by shape, type and support, since no runtime draws the recorded values).",
        "*Skipped* tests are ones ORT 1.31 itself cannot load (IR version 14 / opset 28) or whose",
        "4-bit inputs or outputs ORT's Python API cannot take (bfloat16 and float8 values go in and out as",
        "raw-byte OrtValues through an IO binding).",
        "",
    ]
    total = collections.Counter()
    for c in per_op.values():
        total.update(c)
    lines.append(
        f"Totals: {total['tests']} tests, {total['skipped']} skipped, {total['claimed']} claimed, "
        f"{total['passed']} passed, {total['failed']} failed; {total['all_passed']} fully claimed and passing."
    )
    lines += [
        "",
        "| op | tests | skipped | claimed | fully claimed and passing | passed | failed | of which ORT's CPU EP fails too |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op, c in per_op.items():
        if c["claimed"] or c["failed"]:
            lines.append(
                f"| {op} | {c['tests']} | {c['skipped']} | {c['claimed']} | {c['all_passed']} | {c['passed']} "
                f"| {c['failed']} | {c['cpu_failed']} |"
            )
    unclaimed = [op for op, c in per_op.items() if not c["claimed"] and c["tests"] > c["skipped"]]
    lines += ["", f"Ops whose loadable tests the MLX EP does not claim yet ({len(unclaimed)}): " + ", ".join(unclaimed) + "."]
    ran = [r for r in records if r["result"] != "skipped"]
    failing = sorted(r["test"] for r in ran if r["claimed"] != "none" and r["result"] != "pass")
    cpu_too = sum(1 for r in ran if r["claimed"] != "none" and r["result"] != "pass" and r.get("cpu") != "pass")
    lines += [
        "",
        f"Claimed tests that fail ({len(failing)}; {cpu_too} of them fail on ORT's CPU EP too, whose answers the "
        "MLX EP's follow): " + (", ".join(f"`{t}`" for t in failing) or "none") + ".",
    ]
    known = [(t, FAILING_WHY[t]) for t in failing if t in FAILING_WHY]
    if known:
        lines += ["", "Why:", ""] + [f"- `{t}`: {why}" for t, why in known]
    partly = sorted(r["test"] for r in ran if r["claimed"] != "all")
    lines += [
        "",
        f"Loadable tests not fully claimed ({len(partly)}; README, \"Current limits\", says why for each family): "
        + ", ".join(f"`{t}`" for t in partly)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out-json", required=True)
    p.add_argument("--report")
    p.add_argument("--passing")
    p.add_argument("--check-passing")
    p.add_argument("--data-dir", default=os.path.join("target", "onnx-node-tests"))
    p.add_argument("--property-json", help="include the property suite's table from this file")
    p.add_argument("--report-only", action="store_true", help="rewrite --report from --out-json without running")
    p.add_argument("--only", help="run only the node tests whose name contains this (comma-separated), no model suites")
    args = p.parse_args()
    if args.report_only:
        with open(args.out_json) as f:
            records = json.load(f)
        with open(args.report, "w") as f:
            f.write(report(records, args.property_json))
        return 0
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib or not os.path.exists(lib):
        print(f"ORT_MLX_EP_LIB must point at the built plugin (got {lib!r})")
        return 2
    ort.register_execution_provider_library("MLX", lib)
    ort.set_default_logger_severity(3)
    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node_cases.collect_testcases(None) if c.kind == "node"]
    only = [w for w in (args.only or "").split(",") if w]
    if only:
        cases = [c for c in cases if any(w in c.name for w in only)]
    # The op a test is about: the single node of its unexpanded form (`_expanded` tests are
    # function bodies expanded into primitive ops).
    op_of = {}
    for c in cases:
        if "_expanded" not in c.name and len(c.model.graph.node) == 1:
            n = c.model.graph.node[0]
            op_of[c.name] = (n.op_type, n.domain)
    started = time.time()
    records = []
    for i, case in enumerate(cases):
        records.append(run_case(case, args.data_dir, op_of))
        if (i + 1) % 200 == 0:
            print(f"  {i + 1}/{len(cases)} node tests ({time.time() - started:.0f} s)", flush=True)
    model_started = time.time()
    if not only:
        records += model_suite_records()
    print(f"  model suites: {time.time() - model_started:.0f} s", flush=True)
    with open(args.out_json, "w") as f:
        json.dump(records, f, indent=1)
    claimed = [r for r in records if r["claimed"] != "none" and r["result"] != "skipped"]
    passed = sorted(r["test"] for r in claimed if r["result"] == "pass")
    failed = [r for r in claimed if r["result"] != "pass"]
    both_fail = [r for r in failed if r.get("cpu") != "pass"]
    skipped = sum(1 for r in records if r["result"] == "skipped")
    if args.report:
        with open(args.report, "w") as f:
            f.write(report(records, args.property_json))
    status = 0
    # The committed list only grows: a listed test that no longer passes fails the run (and,
    # with --passing, leaves the list as it was).
    listed = args.check_passing or args.passing
    regressed = []
    if listed and os.path.exists(listed):
        with open(listed) as f:
            expected = {l.strip() for l in f if l.strip() and not l.startswith("#")}
        regressed = sorted(expected - set(passed))
        for t in regressed:
            r = next((r for r in records if r["test"] == t), {})
            print(f"REGRESSION {t}: claimed={r.get('claimed')} result={r.get('result')} {r.get('reason', '')}")
        status = 1 if regressed else 0
    if args.passing and not regressed:
        with open(args.passing, "w") as f:
            f.write("".join(t + "\n" for t in passed))
    print(
        f"node tests: {len(records)} run, {skipped} skipped (ORT cannot load them), {len(claimed)} claimed by the MLX EP, "
        f"{len(passed)} of those passed, {len(failed)} failed ({len(both_fail)} of them fail on ORT's CPU EP too) "
        f"({time.time() - started:.0f} s)"
    )
    for r in failed:
        print(f"  {r['result']}: {r['test']} ({r['claimed']}; CPU EP: {r.get('cpu')}) {r.get('reason', '')}")
    return status


if __name__ == "__main__":
    sys.exit(main())
