"""One-query GroupQueryAttention over a static KV buffer (a decode step of a genai-style
decoder), the EP against ORT's CPU EP: `gpu/run.sh attention` checks the EP's own CUDA
attention kernel (`crates/ops-attention/src/one_query.rs`) on head sizes, head groupings,
types and per-entry lengths a decoder does not cover.

  python gpu/attention_models.py build OUT_DIR   (here: needs the onnx package, which the
                                                  GPU machine lacks; writes gqa_*.onnx)
  python gpu/attention_models.py check DIR       (there: each model through both EPs)"""
import glob
import json
import os
import sys

import numpy as np

# name: (type, batch, heads, kv_heads, head size, buffer rows, seqlens_k per entry, packed, rotary)
CASES = {
    "qwen_f16": ("float16", 1, 14, 2, 64, 160, [129], True, True),
    "qwen_f32": ("float32", 1, 14, 2, 64, 160, [129], True, True),
    "mha_d128": ("float16", 2, 8, 8, 128, 128, [5, 100], False, False),
    "d32_ragged": ("float16", 3, 4, 1, 32, 37, [0, 17, 36], False, False),
    "d256_f32": ("float32", 2, 4, 2, 256, 64, [63, 1], True, False),
}


def build(out):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    os.makedirs(out, exist_ok=True)
    for name, (ty, b, h, kv, d, rows, seqlens, packed, rotary) in CASES.items():
        et = TensorProto.FLOAT16 if ty == "float16" else TensorProto.FLOAT
        width = (h + 2 * kv) * d if packed else h * d
        ins = [helper.make_tensor_value_info("query", et, [b, 1, width])]
        names = ["query"]
        if packed:
            names += ["", ""]
        else:
            ins += [helper.make_tensor_value_info(n, et, [b, 1, kv * d]) for n in ("key", "value")]
            names += ["key", "value"]
        ins += [helper.make_tensor_value_info(n, et, [b, kv, rows, d]) for n in ("past_key", "past_value")]
        ins += [
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [b]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ]
        names += ["past_key", "past_value", "seqlens_k", "total_sequence_length"]
        inits = []
        if rotary:
            pos = np.arange(rows)[:, None] / (10000.0 ** (np.arange(d // 2)[None, :] * 2.0 / d))
            npt = np.float16 if ty == "float16" else np.float32
            inits = [numpy_helper.from_array(np.cos(pos).astype(npt), "cos"), numpy_helper.from_array(np.sin(pos).astype(npt), "sin")]
            names += ["cos", "sin"]
        outs = [
            helper.make_tensor_value_info("output", et, [b, 1, h * d]),
            helper.make_tensor_value_info("present_key", et, [b, kv, rows, d]),
            helper.make_tensor_value_info("present_value", et, [b, kv, rows, d]),
        ]
        node = helper.make_node(
            "GroupQueryAttention", names, ["output", "present_key", "present_value"], domain="com.microsoft",
            num_heads=h, kv_num_heads=kv, do_rotary=int(rotary))
        graph = helper.make_graph([node], name, ins, outs, inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 10
        model.metadata_props.add(key="seqlens_k", value=json.dumps(seqlens))
        onnx.save(model, os.path.join(out, f"gqa_{name}.onnx"))
        print("wrote", f"gqa_{name}.onnx")


def check(where):
    import onnxruntime as ort

    lib = os.environ["ORT_MLX_EP_LIB"]
    ort.register_execution_provider_library("MLX", lib)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "MLXExecutionProvider"]
    failed = 0
    for path in sorted(glob.glob(os.path.join(where, "gqa_*.onnx"))):
        cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        opts = ort.SessionOptions()
        opts.add_provider_for_devices(devices[:1], {})
        # Every node on the MLX EP, or no session.
        opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        mlx = ort.InferenceSession(path, sess_options=opts)
        seqlens = json.loads(cpu.get_modelmeta().custom_metadata_map["seqlens_k"])
        rng = np.random.default_rng(7)
        feeds = {}
        for i in cpu.get_inputs():
            if i.name == "seqlens_k":
                feeds[i.name] = np.array(seqlens, dtype=np.int32)
            elif i.name == "total_sequence_length":
                feeds[i.name] = np.array(max(seqlens) + 1, dtype=np.int32)
            else:
                dt = np.float16 if i.type == "tensor(float16)" else np.float32
                feeds[i.name] = rng.standard_normal(i.shape).astype(dt)
        want = cpu.run(None, feeds)
        got = mlx.run(None, feeds)
        worst = 0.0
        for w, g in zip(want, got):
            w, g = w.astype(np.float64), g.astype(np.float64)
            err = np.abs(w - g) / (1e-2 + np.abs(w))
            worst = max(worst, float(err.max()))
        tol = 2e-2 if want[0].dtype == np.float16 else 1e-4
        ok = worst <= tol and all(w.shape == g.shape for w, g in zip(want, got))
        failed += not ok
        print(f"{os.path.basename(path)}: largest relative difference {worst:.2e} (tolerance {tol:.0e}) {'ok' if ok else 'FAILED'}")
    if failed:
        sys.exit(f"{failed} model(s) differ")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("build", "check"):
        sys.exit(__doc__)
    (build if sys.argv[1] == "build" else check)(sys.argv[2])
