"""Models that time one kind of MLX primitive through the EP: a chain of N identical nodes on
a [1, 896] float16 tensor (a decode step's width), so that the EP's bare compiled graph divided
by N is the cost of one primitive on the device (host dispatch and kernel), run by
`gpu/run.sh primcost`. Written here (the GPU machine has no onnx package) into
target/gpu/models/, which `cargo xtask gpu-stage` leaves for the second call to carry.

  add    N Adds of a same-shape constant: an elementwise kernel per node
  addb   N Adds of a [896] constant: the same, with a broadcast operand
  cast   N/2 float16 -> float32 -> float16 pairs: a conversion kernel per node

usage: python gpu/chain_models.py [OUT_DIR] [N]"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(path, nodes, inits):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 896])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 896])
    graph = helper.make_graph(nodes, os.path.basename(path), [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)


def chain(op, n, const):
    names = ["x"] + [f"v{i}" for i in range(n - 1)] + ["y"]
    return [helper.make_node(op, [names[i], const], [names[i + 1]]) for i in range(n)]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "target/gpu/models"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    os.makedirs(out, exist_ok=True)
    same = numpy_helper.from_array(np.full((1, 896), 1e-3, np.float16), "c")
    save(f"{out}/add.onnx", chain("Add", n, "c"), [same])
    row = numpy_helper.from_array(np.full((896,), 1e-3, np.float16), "c")
    save(f"{out}/addb.onnx", chain("Add", n, "c"), [row])
    nodes, prev = [], "x"
    for i in range(n // 2):
        nodes.append(helper.make_node("Cast", [prev], [f"w{i}"], to=TensorProto.FLOAT))
        prev = "y" if i == n // 2 - 1 else f"h{i}"
        nodes.append(helper.make_node("Cast", [f"w{i}"], [prev], to=TensorProto.FLOAT16))
    save(f"{out}/cast.onnx", nodes, [])
    print(f"wrote add, addb, cast ({n} nodes each) into {out}")


if __name__ == "__main__":
    main()
