"""The EP's memory as an ORT device, exercised on MLX's CPU backend: with
ONNXRUNTIME_EP_MLX_DEVICE_MEMORY=1 the plugin's device registers its own memory (allocator and
data transfer), as it does on a GPU. Checks: the device and its memory info; plain runs (ORT
copies inputs in and outputs out through the EP's data transfer); IOBinding with inputs and
outputs held in the EP's memory (read in place, written by device copies); a KV cache bound as
one buffer for past and present in the EP's memory (only the changed rows are written); and the
provider options: known ones take effect, an unknown key or a bad value fails session creation
with a message naming it.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin. On a GPU machine
(`gpu/run.sh`), MLX_EP_BACKEND=cuda (or metal) checks the same on the GPU's own memory."""

import os
import sys

os.environ["ONNXRUNTIME_EP_MLX_DEVICE_MEMORY"] = "1"

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

EP = "MLXExecutionProvider"
BACKEND = os.environ.get("MLX_EP_BACKEND", "cpu")  # the MLX backend the device must report
VENDOR = 0x4D4C  # the EP's memory on MLX's CPU backend; on a GPU, the GPU's vendor id (below)
FAILED = []


def check(name, fn):
    try:
        fn()
        print(f"ok    {name}")
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the script fails
        FAILED.append(name)
        print(f"FAIL  {name}: {type(e).__name__}: {e}")


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "device", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset < 24 else 11
    onnx.checker.check_model(m)
    return m.SerializeToString()


def mlp():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["a"], name="add"),
        helper.make_node("Tanh", ["a"], ["y"], name="tanh"),
    ]
    return model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        [w, b],
    )


def device():
    global VENDOR
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    assert len(devices) == 1, [d.ep_name for d in ort.get_ep_devices()]
    if BACKEND != "cpu":
        VENDOR = devices[0].device.vendor_id
    return devices[0]


def mlx_session(m, options=None):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([device()], options or {})
    # No silent retry on the CPU EP when the MLX EP refuses the session (Python's default).
    s = ort.InferenceSession(m, so, enable_fallback=0)
    placed = {n.name: sg.ep_name for sg in s.get_provider_graph_assignment_info() for n in sg.get_nodes()}
    assert set(placed.values()) == {EP}, placed
    return s


def cpu(m, feeds):
    return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


def on_device(a):
    return ort.OrtValue.ortvalue_from_numpy(a, "gpu", 0, VENDOR)


def test_device_and_memory():
    d = device()
    assert d.ep_metadata.get("mlx.memory") == "device", d.ep_metadata
    assert d.ep_metadata.get("mlx.backend") == BACKEND, d.ep_metadata
    info = d.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    assert info is not None, "the device registers no memory"
    v = on_device(np.arange(6, dtype=np.float32))
    assert v.device_name().lower() in ("gpu", "cuda"), v.device_name()
    np.testing.assert_array_equal(v.numpy(), np.arange(6, dtype=np.float32))


def test_plain_runs_copy_through_the_device():
    m = mlp()
    s = mlx_session(m)
    for n in (1, 3, 5):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_iobinding_of_device_values():
    m = mlp()
    s = mlx_session(m)
    x = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
    xv = on_device(x)
    yv = ort.OrtValue.ortvalue_from_shape_and_type([4, 8], np.float32, "gpu", 0, VENDOR)
    io = s.io_binding()
    io.bind_ortvalue_input("x", xv)
    io.bind_ortvalue_output("y", yv)
    for _ in range(3):
        s.run_with_iobinding(io)
    assert yv.device_name().lower() in ("gpu", "cuda"), yv.device_name()
    np.testing.assert_allclose(yv.numpy(), cpu(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    # Python's `bind_output(name, "gpu", 0)` takes no vendor id, so ORT looks for vendor 0's
    # allocator and finds none: outputs in the EP's memory are bound as OrtValues, as above.


def kv_model():
    node = helper.make_node("TensorScatter", ["past", "update", "write_indices"], ["present"], name="kv_update")
    return model(
        [node],
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, 8, 4]),
            helper.make_tensor_value_info("update", TensorProto.FLOAT, [2, 1, 4]),
            helper.make_tensor_value_info("write_indices", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, 8, 4])],
        opset=24,
    )


def test_kv_cache_in_device_memory():
    s = mlx_session(kv_model())
    past = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
    want = past.copy()
    cache = on_device(past)
    io = s.io_binding()
    io.bind_ortvalue_input("past", cache)
    io.bind_ortvalue_output("present", cache)
    for step, (a, b) in enumerate([(3, 6), (4, 7)]):
        update = np.full((2, 1, 4), -1.0 - step, np.float32)
        io.bind_cpu_input("update", update)
        io.bind_cpu_input("write_indices", np.array([a, b], np.int64))
        s.run_with_iobinding(io)
        want[0, a] = want[1, b] = -1.0 - step
        np.testing.assert_array_equal(cache.numpy(), want)


def expect_error(options, *needles):
    try:
        mlx_session(mlp(), options)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        msg = str(e)
        for n in needles:
            assert n in msg, f"{options}: '{n}' not in: {msg}"
        return
    raise AssertionError(f"{options} created a session")


def test_options():
    m = mlp()
    x = np.ones((2, 8), np.float32)
    s = mlx_session(m, {"compile": "0", "verbose": "0", "cache_limit": "64M", "zero_copy": "1"})
    np.testing.assert_allclose(s.run(None, {"x": x})[0], cpu(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    expect_error({"compiel": "0"}, "unknown option 'compiel'", "compile")
    expect_error({"compile": "maybe"}, "option 'compile' = 'maybe'", "1/0")
    expect_error({"memory_limit": "lots"}, "option 'memory_limit' = 'lots'", "byte count")
    expect_error({"device": "tpu"}, "option 'device' = 'tpu'", "auto, gpu, cpu")
    if BACKEND == "cpu":
        expect_error({"device": "gpu"}, "device=gpu")
    else:
        # The process settled on the GPU with the first session: a request for the CPU is refused.
        expect_error({"device": "cpu"}, "device")
    # The process settled TF32 off with the first session: a later request for it is refused.
    expect_error({"tf32": "1"}, "tf32")


def main():
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib:
        sys.exit("set ORT_MLX_EP_LIB to the built plugin")
    ort.register_execution_provider_library("MLX", lib)
    for name, fn in [
        ("the EP's device registers its own memory", test_device_and_memory),
        ("plain runs: inputs and outputs through the EP's data transfer", test_plain_runs_copy_through_the_device),
        ("IOBinding of values in the EP's memory", test_iobinding_of_device_values),
        ("a KV cache bound as one buffer in the EP's memory", test_kv_cache_in_device_memory),
        ("provider options: applied, and refused by name when unknown or bad", test_options),
    ]:
        check(name, fn)
    if FAILED:
        sys.exit(f"{len(FAILED)} device-memory check(s) failed: {FAILED}")
    print("device memory: all checks passed")


if __name__ == "__main__":
    main()
