"""Checks an installed `onnxruntime-mlx-ep` wheel in a fresh environment (run by
`cargo xtask test` with that environment's Python): registers the EP through the package,
runs a model, checks through ORT's assignment info that the MLX EP ran its claimed nodes, and
compares the outputs with ORT's CPU EP. Prints a `N passed, N failed` line.

Usage: check_wheel.py MODEL.onnx
"""

import sys

import numpy as np
import onnxruntime as ort

import onnxruntime_mlx


def main() -> int:
    model = sys.argv[1]
    results = []

    def check(name, fn):
        try:
            fn()
            results.append(True)
            print(f"ok   {name}")
        except Exception as e:  # report and go on
            results.append(False)
            print(f"FAIL {name}: {e}")

    def locator():
        assert onnxruntime_mlx.ep_name() == "MLXExecutionProvider"
        assert onnxruntime_mlx.version() == onnxruntime_mlx.__version__
        assert onnxruntime_mlx.library_path().startswith(onnxruntime_mlx.__path__[0])
        onnxruntime_mlx.register_execution_provider_library()
        onnxruntime_mlx.register_execution_provider_library()  # idempotent
        assert any(d.ep_name == "MLXExecutionProvider" for d in ort.get_ep_devices())

    def runs_on_mlx():
        so = onnxruntime_mlx.session_options(**{"session.record_ep_graph_assignment_info": "1"})
        session = ort.InferenceSession(model, so)
        placed = {n.name: sg.ep_name for sg in session.get_provider_graph_assignment_info() for n in sg.get_nodes()}
        on_mlx = [n for n, ep in placed.items() if ep == "MLXExecutionProvider"]
        assert on_mlx, f"no node ran on the MLX EP: {placed}"
        x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
        got = session.run(None, {"x": x})[0]
        cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, cpu, rtol=1e-4, atol=1e-5)
        print(f"     {len(on_mlx)} of {len(placed)} nodes on the MLX EP")

    check("locator API: library path, EP name, idempotent registration", locator)
    check("a model runs on the MLX EP through session_options() and matches the CPU EP", runs_on_mlx)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
