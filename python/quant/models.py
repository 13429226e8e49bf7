"""Small T5/BERT-style float models built with onnx.helper (random weights, fixed seeds) and
their `onnxruntime.quantization.quantize_dynamic` variants, for issue 17.

    target/mlx-ep/venv/bin/python python/quant/models.py [OUT_DIR]

writes OUT_DIR (default target/quant-models/) with <model>.float.onnx and
<model>.<variant>.onnx for every variant in VARIANTS."""

import logging
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "target", "quant-models")

D, H, F, V, LAYERS = 64, 4, 128, 100, 2
DK = D // H
NUM_BUCKETS, MAX_DISTANCE = 32, 128
I64, F32 = TensorProto.INT64, TensorProto.FLOAT


class G:
    """A graph under construction: nodes with unique names, initializers, one RNG."""

    def __init__(self, seed):
        self.nodes, self.inits, self.rng, self.n = [], [], np.random.default_rng(seed), 0

    def name(self, p):
        self.n += 1
        return f"{p}_{self.n}"

    def op(self, op, inputs, n_out=1, **attrs):
        name = self.name(op)
        outs = [f"{name}_o{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=np.float32, p="c"):
        name = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, shape, std, p="w"):
        return self.const(self.rng.standard_normal(shape) * std, p=p)

    def ints(self, v):
        return self.const(v, np.int64, "i")

    # --- building blocks -------------------------------------------------------------------

    def rms_norm(self, x):
        # T5LayerNorm as exported: x * 1/sqrt(mean(x^2) + eps) * w (no mean, no bias).
        var = self.op("ReduceMean", [self.op("Pow", [x, self.const(2.0)])], axes=[-1], keepdims=1)
        inv = self.op("Div", [self.const(1.0), self.op("Sqrt", [self.op("Add", [var, self.const(1e-6)])])])
        w = self.const(1.0 + 0.1 * self.rng.standard_normal(D), p="ln")
        return self.op("Mul", [w, self.op("Mul", [x, inv])])

    def layer_norm_decomposed(self, x, eps=1e-12):
        mean = self.op("ReduceMean", [x], axes=[-1], keepdims=1)
        c = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Pow", [c, self.const(2.0)])], axes=[-1], keepdims=1)
        y = self.op("Div", [c, self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])])
        g = self.const(1.0 + 0.1 * self.rng.standard_normal(D), p="ln_g")
        b = self.const(0.1 * self.rng.standard_normal(D), p="ln_b")
        return self.op("Add", [self.op("Mul", [y, g]), b])

    def layer_norm_op(self, x, eps=1e-12):
        g = self.const(1.0 + 0.1 * self.rng.standard_normal(D), p="ln_g")
        b = self.const(0.1 * self.rng.standard_normal(D), p="ln_b")
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    def linear(self, x, din, dout, bias=False, std=None):
        y = self.op("MatMul", [x, self.weight([din, dout], std or 1.0 / math.sqrt(din))])
        if bias:
            y = self.op("Add", [y, self.const(0.05 * self.rng.standard_normal(dout), p="b")])
        return y

    def heads(self, x):  # [B, S, D] -> [B, H, S, DK]
        return self.op("Transpose", [self.op("Reshape", [x, self.ints([0, -1, H, DK])])], perm=[0, 2, 1, 3])

    def attention(self, x, kv, bias, scale=None, proj_bias=False):
        q = self.heads(self.linear(x, D, D, proj_bias))
        k = self.heads(self.linear(kv, D, D, proj_bias))
        v = self.heads(self.linear(kv, D, D, proj_bias))
        s = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        if scale:
            s = self.op("Div", [s, self.const(scale)])
        if bias is not None:
            s = self.op("Add", [s, bias])
        p = self.op("Softmax", [s], axis=-1)
        o = self.op("Transpose", [self.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        o = self.op("Reshape", [o, self.ints([0, -1, D])])
        return self.linear(o, D, D, proj_bias)

    def gelu_new(self, x):  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = self.op("Pow", [x, self.const(3.0)])
        inner = self.op("Mul", [self.const(math.sqrt(2 / math.pi)), self.op("Add", [x, self.op("Mul", [self.const(0.044715), x3])])])
        return self.op("Mul", [self.op("Mul", [self.const(0.5), x]), self.op("Add", [self.const(1.0), self.op("Tanh", [inner])])])

    def gelu_erf(self, x):  # 0.5 x (1 + erf(x / sqrt 2))
        e = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, self.const(1.0)])]), self.const(0.5)])

    def t5_ffn(self, x, gated):
        if gated:  # T5DenseGatedActDense (flan-t5): wo(gelu_new(wi_0 x) * wi_1 x)
            h = self.op("Mul", [self.gelu_new(self.linear(x, D, F)), self.linear(x, D, F)])
        else:
            h = self.op("Relu", [self.linear(x, D, F)])
        return self.linear(h, F, D)

    def seq_len(self, ids):  # scalar int64 dimension 1 of ids
        return self.op("Gather", [self.op("Shape", [ids]), self.ints(1)], axis=0)

    def position_bias(self, q_len, k_len, bidirectional):
        """T5Attention.compute_bias with _relative_position_bucket, as torch exports it: [1, H, q, k]."""
        zero, one = self.ints(0), self.ints(1)
        ctx = self.op("Unsqueeze", [self.op("Range", [zero, q_len, one]), self.ints([1])])  # [q, 1]
        mem = self.op("Unsqueeze", [self.op("Range", [zero, k_len, one]), self.ints([0])])  # [1, k]
        rel = self.op("Sub", [mem, ctx])  # memory - context
        nb = NUM_BUCKETS
        if bidirectional:
            nb //= 2
            gt = self.op("Cast", [self.op("Greater", [rel, zero])], to=I64)
            buckets = self.op("Mul", [gt, self.ints(nb)])
            rel = self.op("Abs", [rel])
        else:
            buckets = None
            rel = self.op("Neg", [self.op("Min", [rel, self.op("ConstantOfShape", [self.op("Shape", [rel])],
                                                                 value=helper.make_tensor("v", I64, [1], [0]))])])
        max_exact = nb // 2
        small = self.op("Less", [rel, self.ints(max_exact)])
        f = self.op("Div", [self.op("Cast", [rel], to=F32), self.const(float(max_exact))])
        f = self.op("Div", [self.op("Log", [f]), self.const(math.log(MAX_DISTANCE / max_exact))])
        f = self.op("Mul", [f, self.const(float(nb - max_exact))])
        large = self.op("Add", [self.ints(max_exact), self.op("Cast", [f], to=I64)])
        large = self.op("Min", [large, self.op("ConstantOfShape", [self.op("Shape", [large])],
                                               value=helper.make_tensor("v", I64, [1], [nb - 1]))])
        b = self.op("Where", [small, rel, large])
        buckets = b if buckets is None else self.op("Add", [buckets, b])
        table = self.weight([NUM_BUCKETS, H], 1.0, p="rel_bias")
        vals = self.op("Gather", [table, buckets], axis=0)  # [q, k, H]
        return self.op("Unsqueeze", [self.op("Transpose", [vals], perm=[2, 0, 1]), self.ints([0])])

    def padding_bias(self, mask, neg):  # int64 [B, S] -> float [B, 1, 1, S]
        m = self.op("Unsqueeze", [self.op("Cast", [mask], to=F32), self.ints([1, 2])])
        return self.op("Mul", [self.op("Sub", [self.const(1.0), m]), self.const(neg)])


def finish(g, name, inputs, outputs):
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="issue17")
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def ids_input(name="input_ids", seq="seq"):
    return helper.make_tensor_value_info(name, I64, ["batch", seq])


def t5_encoder(seed=1, gated=True):
    g = G(seed)
    ids, mask = "input_ids", "attention_mask"
    x = g.op("Gather", [g.weight([V, D], 1.0, p="shared"), ids], axis=0)
    n = g.seq_len(ids)
    bias = g.op("Add", [g.position_bias(n, n, True), g.padding_bias(mask, float(np.finfo(np.float32).min))])
    for _ in range(LAYERS):
        h = g.rms_norm(x)
        x = g.op("Add", [x, g.attention(h, h, bias)])
        x = g.op("Add", [x, g.t5_ffn(g.rms_norm(x), gated)])
    y = g.rms_norm(x)
    return finish(g, "t5_encoder", [ids_input(), ids_input(mask)],
                  [helper.make_tensor_value_info(y, F32, ["batch", "seq", D])])


def bert_encoder(seed=2):
    g = G(seed)
    ids, mask = "input_ids", "attention_mask"
    n = g.seq_len(ids)
    pos = g.op("Range", [g.ints(0), n, g.ints(1)])
    x = g.op("Add", [g.op("Gather", [g.weight([V, D], 0.5, p="word"), ids], axis=0),
                     g.op("Gather", [g.weight([64, D], 0.5, p="pos"), pos], axis=0)])
    x = g.layer_norm_op(x)
    bias = g.padding_bias(mask, -10000.0)
    for i in range(LAYERS):
        h = g.op("Add", [x, g.attention(x, x, bias, scale=math.sqrt(DK), proj_bias=True)])
        x = g.layer_norm_decomposed(h) if i % 2 == 0 else g.layer_norm_op(h)
        f = g.linear(g.gelu_erf(g.linear(x, D, F, True)), F, D, True)
        h = g.op("Add", [x, f])
        x = g.layer_norm_op(h) if i % 2 == 0 else g.layer_norm_decomposed(h)
    return finish(g, "bert_encoder", [ids_input(), ids_input(mask)],
                  [helper.make_tensor_value_info(x, F32, ["batch", "seq", D])])


def t5_decoder(seed=3, gated=True):
    g = G(seed)
    ids, enc, emask = "input_ids", "encoder_hidden_states", "encoder_attention_mask"
    x = g.op("Gather", [g.weight([V, D], 1.0, p="shared"), ids], axis=0)
    t = g.seq_len(ids)
    # causal: key j > query i is masked (finfo.min, as HF's extended attention mask)
    ar = g.op("Range", [g.ints(0), t, g.ints(1)])
    future = g.op("Greater", [g.op("Unsqueeze", [ar, g.ints([0])]), g.op("Unsqueeze", [ar, g.ints([1])])])
    causal = g.op("Mul", [g.op("Cast", [future], to=F32), g.const(float(np.finfo(np.float32).min))])
    self_bias = g.op("Add", [g.position_bias(t, t, False), causal])
    cross_bias = g.padding_bias(emask, float(np.finfo(np.float32).min))
    for _ in range(LAYERS):
        h = g.rms_norm(x)
        x = g.op("Add", [x, g.attention(h, h, self_bias)])
        x = g.op("Add", [x, g.attention(g.rms_norm(x), enc, cross_bias)])
        x = g.op("Add", [x, g.t5_ffn(g.rms_norm(x), gated)])
    y = g.op("Mul", [g.rms_norm(x), g.const(D ** -0.5)])  # tied embeddings rescale
    logits = g.linear(y, D, V, std=1.0)
    return finish(g, "t5_decoder",
                  [ids_input(seq="tgt"), helper.make_tensor_value_info(enc, F32, ["batch", "seq", D]),
                   ids_input(emask)],
                  [helper.make_tensor_value_info(logits, F32, ["batch", "tgt", V])])


MODELS = {"t5enc": t5_encoder, "t5enc_relu": lambda: t5_encoder(4, gated=False), "bert": bert_encoder,
          "t5dec": t5_decoder}


def variants():
    from onnxruntime.quantization import QuantType

    out = {}
    for pc in (False, True):
        for wt, wn in ((QuantType.QUInt8, "u8"), (QuantType.QInt8, "s8")):
            for ws in (True, False):
                out[f"pc{int(pc)}_{wn}_ws{int(ws)}"] = dict(per_channel=pc, weight_type=wt,
                                                             extra_options={"WeightSymmetric": ws})
    out["pc0_s8_ws1_as1"] = dict(per_channel=False, weight_type=QuantType.QInt8,
                                 extra_options={"WeightSymmetric": True, "ActivationSymmetric": True})
    out["pc1_u8_ws0_as1"] = dict(per_channel=True, weight_type=QuantType.QUInt8,
                                 extra_options={"WeightSymmetric": False, "ActivationSymmetric": True})
    out["pc0_s8_ws1_rr"] = dict(per_channel=False, weight_type=QuantType.QInt8, reduce_range=True,
                                extra_options={"WeightSymmetric": True})
    return out


def main():
    from onnxruntime.quantization import quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    out = sys.argv[1] if len(sys.argv) > 1 else OUT
    os.makedirs(out, exist_ok=True)
    for name, build in MODELS.items():
        m = build()
        fp = os.path.join(out, f"{name}.float.onnx")
        onnx.save(m, fp)
        for vname, kw in variants().items():
            qp = os.path.join(out, f"{name}.{vname}.onnx")
            quantize_dynamic(fp, qp, **kw)
        print(f"{name}: {len(m.graph.node)} nodes, {len(variants())} variants")


if __name__ == "__main__":
    main()
