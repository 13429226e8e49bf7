"""ai.onnx.ml TreeEnsemble (opset 5) on the MLX EP against ORT's CPU EP, on seeded random
forests: its thresholds, leaf weights and member sets are tensor attributes, which the Rust
property suite's cases cannot carry, so its conformance is checked here (as the suite's
coverage check expects). Every branch mode (BRANCH_MEMBER with small sets ORT unrolls and
large ones it keeps as sets), missing-value tracks with NaN features, trees that are a single
leaf, one to three targets, each aggregate function; every model must run on the MLX EP and
match exactly but for the order of float sums (rtol 1e-6).

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin.
usage: check_tree_ensemble.py [--models N] [--seed S]"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from check_plugin import EP, assigned, check, cpu_session, mlx_session, results

# Feature values the forests split on: small integers (members, equality), a few others.
GRID = [0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 12.0, -1.5, 0.25, 40.0]


def forest(rng, features, trees, depth, targets):
    """The v5 attributes of a random forest: branch nodes and leaves listed apart."""
    nodes = {k: [] for k in ("mode", "feature", "split", "true", "false", "tleaf", "fleaf", "missing")}
    members, leaf_targets, leaf_weights, roots = [], [], [], []

    def leaf():
        leaf_targets.append(int(rng.integers(0, targets)))
        leaf_weights.append(float(rng.integers(-8, 9)) * 0.125)
        return len(leaf_targets) - 1

    def branch(d):
        # Returns (index, is_leaf) of a subtree.
        if d >= depth or (d > 0 and rng.integers(0, 3) == 0):
            return leaf(), True
        i = len(nodes["mode"])
        mode = int(rng.integers(0, 7))
        for k, v in (("mode", mode), ("feature", int(rng.integers(0, features))),
                     ("split", float(rng.choice(GRID))), ("missing", int(rng.integers(0, 2)))):
            nodes[k].append(v)
        for k in ("true", "false", "tleaf", "fleaf"):
            nodes[k].append(0)
        if mode == 6:
            # Small sets of small integers (ORT unrolls them), or a large or wide one (kept a set).
            size = int(rng.integers(1, 4)) if rng.integers(0, 2) else int(rng.integers(31, 40))
            members.extend([float(v) for v in rng.choice(np.arange(0, 60), size=size, replace=False)] + [np.nan])
        t, tl = branch(d + 1)
        f, fl = branch(d + 1)
        nodes["true"][i], nodes["tleaf"][i], nodes["false"][i], nodes["fleaf"][i] = t, int(tl), f, int(fl)
        return i, False

    for _ in range(trees):
        if rng.integers(0, 6) == 0:
            # A tree of one leaf: a root entry naming it on both sides.
            i, lf = len(nodes["mode"]), leaf()
            for k, v in (("mode", 0), ("feature", 0), ("split", 0.0), ("missing", 0),
                         ("true", lf), ("false", lf), ("tleaf", 1), ("fleaf", 1)):
                nodes[k].append(v)
            roots.append(i)
            continue
        i, is_leaf = branch(0)
        if is_leaf:
            continue
        roots.append(i)
    if not roots:
        return None
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)
    attrs = dict(
        n_targets=targets,
        tree_roots=roots,
        nodes_modes=numpy_helper.from_array(np.array(nodes["mode"], np.uint8), "nodes_modes"),
        nodes_featureids=nodes["feature"],
        nodes_splits=f32("nodes_splits", nodes["split"]),
        nodes_truenodeids=nodes["true"],
        nodes_falsenodeids=nodes["false"],
        nodes_trueleafs=nodes["tleaf"],
        nodes_falseleafs=nodes["fleaf"],
        nodes_missing_value_tracks_true=nodes["missing"],
        leaf_targetids=leaf_targets,
        leaf_weights=f32("leaf_weights", leaf_weights),
    )
    if members:
        attrs["membership_values"] = f32("membership_values", members)
    return attrs


def tree_model(attrs, features, targets, aggregate):
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", aggregate_function=aggregate, **attrs)
    graph = helper.make_graph(
        [node],
        "tree",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, targets])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    m.ir_version = 10
    return m.SerializeToString()


def test_random_forests(count, seed):
    rng = np.random.default_rng(seed)
    ran = 0
    while ran < count:
        features, trees = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        depth, targets, aggregate = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(0, 4))
        attrs = forest(rng, features, trees, depth, targets)
        if attrs is None:
            continue
        m = tree_model(attrs, features, targets, aggregate)
        s = mlx_session(m)
        a = assigned(s)
        assert a and set(a.values()) == {EP}, f"model {ran}: nodes left to other EPs: {a}"
        x = rng.choice(GRID + [np.nan], size=(7, features)).astype(np.float32)
        x[0] += rng.normal(size=features).astype(np.float32)
        got, want = s.run(None, {"X": x})[0], cpu_session(m).run(None, {"X": x})[0]
        assert got.shape == want.shape, (ran, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"model {ran} (seed {seed})")
        ran += 1


def test_node_suite_model():
    """ONNX's own set-membership case, with its data set (from the installed onnx package)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases() if c.name == "test_ai_onnx_ml_tree_ensemble_set_membership"]
    assert cases, "onnx's test_ai_onnx_ml_tree_ensemble_set_membership case is missing"
    case = cases[0]
    case.model.ir_version = min(case.model.ir_version, 10)
    s = mlx_session(case.model.SerializeToString())
    assert set(assigned(s).values()) == {EP}, assigned(s)
    for inputs, outputs in case.data_sets:
        got = s.run(None, {s.get_inputs()[0].name: inputs[0]})[0]
        np.testing.assert_allclose(got, outputs[0], rtol=1e-6, atol=1e-6)


def main():
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib or not os.path.exists(lib):
        print(f"ORT_MLX_EP_LIB must point at the built plugin (got {lib!r})")
        return 2
    args = sys.argv[1:]
    count = int(args[args.index("--models") + 1]) if "--models" in args else 150
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 20261206
    ort.register_execution_provider_library("MLX", lib)
    check(f"TreeEnsemble: {count} random forests on MLX match the CPU EP", lambda: test_random_forests(count, seed))
    check("TreeEnsemble: ONNX's set-membership node test", test_node_suite_model)
    failed = sum(1 for _, e in results if e is not None)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
