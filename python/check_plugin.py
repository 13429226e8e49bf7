"""Checks the built plugin from Python, the way users load it: ONNX Runtime 1.31.1 from PyPI
registers the library, a session runs a graph with claimed and unclaimed nodes, ORT's own
assignment info must show which EP ran each node, and outputs must match the CPU EP's.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin."""

import gc
import os
import re
import subprocess
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
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def mlx_session(model_bytes):
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    assert devices, f"no {EP} device after registering the plugin"
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(devices, {})
    s = ort.InferenceSession(model_bytes, so)
    # A failed run must fail the check, not be retried on ORT's CPU EP (the Python API's default).
    s.disable_fallback()
    return s


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
            # A form the MLX EP declines (it lowers LinearRegressor's post_transform NONE only):
            # identity coefficients, so softmax(r).
            helper.make_node("LinearRegressor", ["r"], ["c"], name="impute", domain="ai.onnx.ml",
                             coefficients=np.eye(5, dtype=np.float32).ravel().tolist(), targets=5,
                             post_transform="SOFTMAX"),
            helper.make_node("Softmax", ["c"], ["y"], name="softmax", axis=-1),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(w, "W")],
    )
    s = mlx_session(m)
    a = assigned(s)
    assert a == {"mm": EP, "relu": EP, "impute": "CPUExecutionProvider", "softmax": EP}, a
    x = rng.standard_normal((4, 8)).astype(np.float32)
    got = s.run(None, {"x": x})[0]
    want = cpu_session(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    r = np.maximum(x @ w, 0)
    h = np.exp(r) / np.exp(r).sum(-1, keepdims=True)  # the declined regressor
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


def if_model(then_op):
    """relu -> If(cond) -> tanh; the branches read `x` and the initializer `W` from the outer scope."""
    then_g = helper.make_graph(
        [helper.make_node(then_op, ["x", "W"], ["t_out"], name="then_node")]
        if then_op != "RandomUniformLike"
        else [
            # A form the MLX EP declines (MLX draws no float64); seeded, so both sessions draw
            # the same values on the CPU EP.
            helper.make_node("RandomUniformLike", ["x"], ["t64"], name="then_node", seed=1.0, dtype=TensorProto.DOUBLE),
            helper.make_node("Cast", ["t64"], ["t_out"], name="then_cast", to=TensorProto.FLOAT),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["e_out"], name="else_node")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [3])],
    )
    return model(
        [
            helper.make_node("Relu", ["inp"], ["x"], name="relu"),
            helper.make_node("If", ["cond"], ["r"], name="branch", then_branch=then_g, else_branch=else_g),
            helper.make_node("Tanh", ["r"], ["y"], name="tanh"),
        ],
        [
            helper.make_tensor_value_info("inp", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([10, 20, 30], np.float32), "W")],
    )


def check_if(then_op, expected_if_ep):
    m = if_model(then_op)
    s = mlx_session(m)
    a = assigned(s)
    assert a.get("branch") == expected_if_ep, a
    assert a["relu"] == EP and a["tanh"] == EP, a
    ref = cpu_session(m)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for cond in (True, False):
        feed = {"inp": x, "cond": np.array(cond)}
        np.testing.assert_allclose(s.run(None, feed)[0], ref.run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_if_runs_whole_on_mlx():
    check_if("Add", EP)


def test_if_with_an_unsupported_branch_node_stays_on_cpu():
    check_if("RandomUniformLike", "CPUExecutionProvider")


SUB_BYTE = [(TensorProto.INT4, -8, 8), (TensorProto.UINT4, 0, 16), (TensorProto.INT2, -2, 2), (TensorProto.UINT2, 0, 4)]


def test_int4_dequantize():
    """int4/uint4 weights (packed two per byte) and int2/uint2 ones (four per byte)
    dequantized in blocks, fed by a runtime activation so the node is not folded away; the
    packed tensors are unpacked by the EP."""
    rng = np.random.default_rng(3)
    for elem, lo, hi in SUB_BYTE:
        q = rng.integers(lo, hi, size=(4, 6))
        zp = rng.integers(lo, hi, size=(4, 3))
        scale = rng.uniform(0.1, 1.0, size=(4, 3)).astype(np.float32)
        inits = [
            helper.make_tensor("q", elem, [4, 6], q.flatten().tolist()),
            helper.make_tensor("zp", elem, [4, 3], zp.flatten().tolist()),
            numpy_helper.from_array(scale, "scale"),
        ]
        nodes = [
            helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["w"], name="dq", axis=1, block_size=2),
            helper.make_node("Add", ["w", "x"], ["y"], name="add"),
        ]
        m = model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
            inits,
            opset=25 if elem in (TensorProto.INT2, TensorProto.UINT2) else 21,
        )
        x = rng.standard_normal((4, 6)).astype(np.float32)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        cpu = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        s = mlx_session(m)
        got = s.run(None, {"x": x})[0]
        assert assigned(s)["dq"] == EP, assigned(s)
        expected = (q - np.repeat(zp, 2, axis=1)) * np.repeat(scale, 2, axis=1) + x
        np.testing.assert_allclose(cpu, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, cpu, rtol=1e-6, atol=1e-6)


def test_int4_quantize():
    """QuantizeLinear to int4/uint4/int2/uint2 (blocked) on MLX, its packed output read by a
    Cast to int8 that stays on ORT's CPU EP (ORT's Python API cannot return such arrays)."""
    rng = np.random.default_rng(5)
    for elem, lo, hi in SUB_BYTE:
        zp = rng.integers(lo, hi, size=(4, 3))
        scale = rng.uniform(0.2, 1.0, size=(4, 3)).astype(np.float32)
        inits = [numpy_helper.from_array(scale, "scale"), helper.make_tensor("zp", elem, [4, 3], zp.flatten().tolist())]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="q", axis=1, block_size=2),
            helper.make_node("Cast", ["q"], ["q8"], name="widen", to=TensorProto.INT8),
        ]
        m = model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
            [helper.make_tensor_value_info("q8", TensorProto.INT8, [4, 6])],
            inits,
            opset=25 if elem in (TensorProto.INT2, TensorProto.UINT2) else 21,
        )
        x = (rng.standard_normal((4, 6)) * 6).astype(np.float32)
        cpu = cpu_session(m).run(None, {"x": x})[0]
        s = mlx_session(m)
        got = s.run(None, {"x": x})[0]
        placement = assigned(s)
        assert placement["q"] == EP and placement["widen"] == "CPUExecutionProvider", placement
        np.testing.assert_array_equal(got, cpu)
        assert len(np.unique(cpu)) >= min(4, hi - lo - 1), cpu  # not saturated to a constant


def test_float8_values_cross_partitions():
    """float8 values (held by the EP as their bytes) leave a partition for an op whose lowering
    does not take float8 (Transpose, on ORT's CPU EP) and come back; a float8 QDQ pair, a
    saturating Cast and one that is not, each on MLX; a float8 zero point other than 0 is an
    error naming the node, as on ORT's CPU EP."""
    f8 = TensorProto.FLOAT8E4M3FN
    nodes = [
        helper.make_node("Cast", ["x"], ["t"], name="encode", to=f8, saturate=0),
        helper.make_node("Transpose", ["t"], ["tt"], name="transpose"),
        helper.make_node("Cast", ["tt"], ["y"], name="decode", to=TensorProto.FLOAT),
        helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], name="q", output_dtype=TensorProto.FLOAT8E5M2),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["z"], name="dq"),
    ]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    m = model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2]), helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
        inits,
        opset=21,
    )
    x = np.array([[0.3, 1000.0, -2.7], [1e-3, 447.0, -0.0]], np.float32)
    s = mlx_session(m)
    got = s.run(None, {"x": x})
    placement = assigned(s)
    assert placement["transpose"] == "CPUExecutionProvider", placement
    assert all(placement[n] == EP for n in ("encode", "decode", "q", "dq")), placement
    cpu = cpu_session(m).run(None, {"x": x})
    for g, c in zip(got, cpu):
        np.testing.assert_array_equal(g, c)
    # 1000 past E4M3FN's 448 without saturation: NaN; 447 rounds to 448.
    assert np.isnan(got[0][1, 0]) and got[0][1, 1] == 448.0, got[0]
    zp_model = model(
        [
            helper.make_node("Cast", ["x"], ["t"], name="encode", to=f8),
            helper.make_node("DequantizeLinear", ["t", "scale", "zp"], ["y"], name="dq_with_zero_point"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        inits + [helper.make_tensor("zp", f8, [], [1.0])],
        opset=21,
    )
    try:
        mlx_session(zp_model).run(None, {"x": x})
    except Exception as e:
        assert "dq_with_zero_point" in str(e) and "zero point must be 0" in str(e), e
    else:
        raise AssertionError("a float8 zero point of 1 ran")


def kv_model():
    node = helper.make_node("TensorScatter", ["past", "update", "write_indices"], ["present"], name="kv_update")
    graph = helper.make_graph(
        [node],
        "kv",
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, 8, 4]),
            helper.make_tensor_value_info("update", TensorProto.FLOAT, [2, 1, 4]),
            helper.make_tensor_value_info("write_indices", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, 8, 4])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    m.ir_version = 11
    return m.SerializeToString()


def kv_inputs():
    past = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
    update = -np.ones((2, 1, 4), np.float32)
    idx = np.array([3, 6], np.int64)
    want = past.copy()
    want[0, 3] = -1
    want[1, 6] = -1
    return past, update, idx, want


def run_shared_buffer(session):
    """past and present bound to one buffer, as onnxruntime-genai binds a KV cache."""
    past, update, idx, want = kv_inputs()
    cache = ort.OrtValue.ortvalue_from_numpy(past)
    binding = session.io_binding()
    binding.bind_ortvalue_input("past", cache)
    binding.bind_cpu_input("update", update)
    binding.bind_cpu_input("write_indices", idx)
    binding.bind_ortvalue_output("present", cache)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(cache.numpy(), want)


def test_kv_cache_update():
    m = kv_model()
    s = mlx_session(m)
    assert assigned(s) == {"kv_update": EP}, assigned(s)
    past, update, idx, want = kv_inputs()
    original = past.copy()
    np.testing.assert_array_equal(s.run(None, {"past": past, "update": update, "write_indices": idx})[0], want)
    np.testing.assert_array_equal(past, original)  # a plain run never touches the caller's input
    run_shared_buffer(s)


def test_kv_cache_shared_buffer_copies_only_changed_rows():
    # A child process prints the EP's session summary at teardown; read its in-place counters.
    env = dict(os.environ, ONNXRUNTIME_EP_MLX_VERBOSE="1")
    child = subprocess.run([sys.executable, __file__, "--kv-child"], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stdout + child.stderr
    found = re.search(r"in-place outputs: (\d+) bytes of changed rows written, (\d+) bytes already in place", child.stderr)
    assert found, child.stderr
    written, in_place = int(found.group(1)), int(found.group(2))
    row = 4 * 4  # one row of 4 float32
    assert (written, in_place) == (2 * row, 2 * 8 * row - 2 * row), (written, in_place)


def kv_child():
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    s = mlx_session(kv_model())
    run_shared_buffer(s)
    del s
    gc.collect()
    return 0


def gqa_static_model():
    """One decode step of GroupQueryAttention over a static KV buffer of 6 rows."""
    f = TensorProto.FLOAT
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"],
        name="gqa",
        domain="com.microsoft",
        num_heads=2,
        kv_num_heads=1,
    )
    graph = helper.make_graph(
        [node],
        "gqa",
        [
            helper.make_tensor_value_info("query", f, [1, 1, 16]),
            helper.make_tensor_value_info("key", f, [1, 1, 8]),
            helper.make_tensor_value_info("value", f, [1, 1, 8]),
            helper.make_tensor_value_info("past_key", f, [1, 1, 6, 8]),
            helper.make_tensor_value_info("past_value", f, [1, 1, 6, 8]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ],
        [
            helper.make_tensor_value_info("output", f, [1, 1, 16]),
            helper.make_tensor_value_info("present_key", f, [1, 1, 6, 8]),
            helper.make_tensor_value_info("present_value", f, [1, 1, 6, 8]),
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def test_gqa_shared_buffer_then_plain_runs():
    """A run whose present is bound to past's buffer leaves the present out of its evaluation
    (only the new rows are written); a later run whose present ORT allocates apart must still
    get the whole present."""
    m = gqa_static_model()
    s, cpu = mlx_session(m), cpu_session(m)
    assert assigned(s) == {"gqa": EP}, assigned(s)
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    values = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    k_cache, v_cache = ort.OrtValue.ortvalue_from_numpy(keys.copy()), ort.OrtValue.ortvalue_from_numpy(values.copy())
    for step, shared in enumerate([True, True, True, False, True, False, False]):
        feeds = {
            "query": rng.standard_normal((1, 1, 16)).astype(np.float32),
            "key": rng.standard_normal((1, 1, 8)).astype(np.float32),
            "value": rng.standard_normal((1, 1, 8)).astype(np.float32),
            "seqlens_k": np.array([step % 5], np.int32),
            "total_sequence_length": np.array(step % 5 + 1, np.int32),
        }
        want = cpu.run(None, dict(feeds, past_key=k_cache.numpy(), past_value=v_cache.numpy()))
        if shared:
            binding = s.io_binding()
            for name, value in feeds.items():
                binding.bind_cpu_input(name, value)
            binding.bind_ortvalue_input("past_key", k_cache)
            binding.bind_ortvalue_input("past_value", v_cache)
            binding.bind_output("output")
            binding.bind_ortvalue_output("present_key", k_cache)
            binding.bind_ortvalue_output("present_value", v_cache)
            s.run_with_iobinding(binding)
            got = [binding.copy_outputs_to_cpu()[0], k_cache.numpy(), v_cache.numpy()]
        else:
            got = s.run(None, dict(feeds, past_key=k_cache.numpy(), past_value=v_cache.numpy()))
            k_cache, v_cache = ort.OrtValue.ortvalue_from_numpy(got[1]), ort.OrtValue.ortvalue_from_numpy(got[2])
        # (ORT defines the present's rows up to the total length; past them its CPU EP leaves zeros.)
        t = step % 5 + 1
        got, want = [got[0], got[1][:, :, :t], got[2][:, :, :t]], [want[0], want[1][:, :, :t], want[2][:, :, :t]]
        for name, g, w in zip(["output", "present_key", "present_value"], got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"step {step} ({'shared' if shared else 'plain'}): {name}")


def memo_child():
    """With inputs copied (as on GPUs), an unchanged input is not copied again, and one changed
    in place between runs is seen."""
    ort.register_execution_provider_library("MLX", os.environ["ORT_MLX_EP_LIB"])
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="double")]
    m = model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    s = mlx_session(m)
    x = np.arange(1024, dtype=np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(x)  # one buffer, reused across runs
    for expected_offset in [0, 0, 0]:
        got = s.run_with_ort_values(["y"], {"x": value})[0].numpy()
        np.testing.assert_array_equal(got, 2 * (np.arange(1024, dtype=np.float32) + expected_offset))
    # Changed in place, same buffer: must be seen.
    value.update_inplace(x + 1)
    got = s.run_with_ort_values(["y"], {"x": value})[0].numpy()
    np.testing.assert_array_equal(got, 2 * (np.arange(1024, dtype=np.float32) + 1))
    del s
    gc.collect()
    return 0


def test_unchanged_inputs_are_not_copied_again():
    env = dict(os.environ, ONNXRUNTIME_EP_MLX_VERBOSE="1", ONNXRUNTIME_EP_MLX_ZERO_COPY="0")
    child = subprocess.run([sys.executable, __file__, "--memo-child"], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stdout + child.stderr
    found = re.search(r"unchanged, not copied again: (\d+) bytes", child.stderr)
    assert found, child.stderr
    # Runs 2 and 3 reuse the first copy; the run after the in-place change copies again.
    assert int(found.group(1)) == 2 * 1024 * 4, found.group(0)


def test_maxpool_indices_ties_nan():
    """MaxPool's Indices: windows of ties, NaN and -inf (ORT's scan keeps a window's first
    element unless a later one is strictly greater), 1-D to 3-D, row- and column-major."""
    rng = np.random.default_rng(0)
    forms = [((2, 3, 6, 7), [3, 3], [1, 2], [1, 1, 1, 1], 0), ((2, 3, 6, 7), [3, 3], [1, 2], [1, 1, 1, 1], 1),
             ((1, 2, 9), [3], [2], [1, 1], 0), ((1, 2, 4, 5, 6), [2, 2, 2], [1, 1, 1], [1, 0, 1, 1, 0, 1], 0)]
    for shape, kernel, strides, pads, order in forms:
        node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=kernel, strides=strides,
                                pads=pads, storage_order=order)
        m = model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"y{j}" for j in range(len(shape))]),
                   helper.make_tensor_value_info("i", TensorProto.INT64, [f"i{j}" for j in range(len(shape))])],
                  opset=12)
        s, cpu = mlx_session(m), cpu_session(m)
        assert assigned(s) == {"pool": EP}, assigned(s)
        for trial in range(6):
            x = rng.integers(0, 2, shape).astype(np.float32)  # ties everywhere
            if trial % 3 == 0:
                x[0, 0] = -np.inf
            if trial % 2 == 0:
                x.ravel()[rng.integers(0, x.size, 5)] = np.nan
            got, want = s.run(None, {"x": x}), cpu.run(None, {"x": x})
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"values {shape} order {order}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"indices {shape} order {order}")


def main():
    if sys.argv[1:] == ["--kv-child"]:
        return kv_child()
    if sys.argv[1:] == ["--memo-child"]:
        return memo_child()
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib or not os.path.exists(lib):
        print(f"ORT_MLX_EP_LIB must point at the built plugin (got {lib!r})")
        return 2
    ort.register_execution_provider_library("MLX", lib)
    check("onnxruntime is the pinned 1.31.1", test_version)
    check("mixed graph: claimed nodes on MLX, a declined LinearRegressor on CPU, outputs match", test_mixed_graph)
    check("float16 graph on MLX", test_float16)
    check("If with outer-scope values: the whole node on MLX, both branches match", test_if_runs_whole_on_mlx)
    check("If whose branch has an unsupported node stays on CPU and matches", test_if_with_an_unsupported_branch_node_stays_on_cpu)
    check("KV cache update (TensorScatter): plain run and past/present sharing one buffer", test_kv_cache_update)
    check("shared KV buffer: only the changed rows are copied", test_kv_cache_shared_buffer_copies_only_changed_rows)
    check("GroupQueryAttention: shared-buffer runs and plain runs in turn, each whole", test_gqa_shared_buffer_then_plain_runs)
    check("int4/uint4/int2/uint2 blocked DequantizeLinear on MLX", test_int4_dequantize)
    check("int4/uint4/int2/uint2 blocked QuantizeLinear on MLX, packed into ORT's output", test_int4_quantize)
    check("copied inputs: unchanged ones reused, ones changed in place seen", test_unchanged_inputs_are_not_copied_again)
    check("float8 values cross partitions as their bytes; float8 Cast and QDQ on MLX", test_float8_values_cross_partitions)
    check("MaxPool's Indices over ties, NaN and -inf, 1-D to 3-D, both storage orders", test_maxpool_indices_ties_nan)
    failed = sum(1 for _, e in results if e is not None)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
