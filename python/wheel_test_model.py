"""Writes the small model `check_wheel.py` runs: `relu(x @ W + b)` then a softmax, with x of
shape [4, 8] (ORT fuses the MatMul and Add into a Gemm before the EP sees them).

Usage: wheel_test_model.py OUT.onnx
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(1)
w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "W")
b = numpy_helper.from_array(rng.standard_normal((6,)).astype(np.float32), "b")
nodes = [
    helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
    helper.make_node("Add", ["h", "b"], ["a"], name="bias"),
    helper.make_node("Relu", ["a"], ["r"], name="relu"),
    helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1),
]
graph = helper.make_graph(
    nodes,
    "wheel_check",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
    [w, b],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
onnx.checker.check_model(model)
onnx.save(model, sys.argv[1])
