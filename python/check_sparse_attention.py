"""com.microsoft SparseAttention (Phi-3-small's block-sparse attention) on the MLX EP against a
numpy reference written from the op's definition: ORT 1.31's CPU kernel runs only with the
present KV bound to the past's buffer and, where a batch entry's key length differs from
total_sequence_length, its answers differ from the op's definition even on the valid query
rows (12 of 12 such cases when this check was written), so it cannot be the property suite's
reference. The reference is itself checked against ORT's CPU kernel
where that kernel is dependable (every entry as long as the total, buffers bound).

Cases: prompts with right padding per batch entry, one-token decode steps and multi-token
steps after a past; packed and separate Q/K/V; grouped KV heads; one or two layouts (local
windows with vertical stride columns, dense rows, dense layouts); block sizes 16 and 32;
rotary (half-split or interleaved, whole or partial); float32 and float16; block lists as
initializers or graph inputs; layouts that ORT's dense-row and dense-layout rules read in
their own ways. Every model must run on the MLX EP; the output and both present buffers
(every row: the rows outside the new ones are the past's) are compared, and every other case
runs again with present bound to past's buffer, as ORT runs this op.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin.
usage: check_sparse_attention.py [--cases N] [--seed S]"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from check_plugin import EP, assigned, check, mlx_session, results

NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def layout(rng, blocks, kind):
    """One layout's block columns, row by row: 'local' (a lower-triangular window of blocks with
    every third column), 'dense' (the whole lower triangle), 'odd' (rows ORT's rules read in
    their own ways: some without their diagonal block, some listing `r + 1` blocks with one
    above the diagonal, read as dense), 'full' (as many entries as the lower triangle, one
    row short of its blocks and another listing a block twice: the whole layout read as
    dense)."""
    window = int(rng.integers(1, 3))
    rows = [[c for c in range(r + 1) if kind == "dense" or r - c < window or c % 3 == 0] for r in range(blocks)]
    if kind == "odd":
        for r in range(blocks):
            pick = int(rng.integers(0, 3))
            if pick == 0 and r > 0:
                rows[r] = [c for c in rows[r] if c != r] or [0]
            elif pick == 1 and r + 1 < blocks:
                rows[r] = [c for c in range(r)] + [r + 1]
    if kind == "full" and blocks >= 3:
        rows = [list(range(r + 1)) for r in range(blocks)]
        rows[1] = [1]
        rows[2] = rows[2] + [2]
    return rows


def csr(layouts):
    """block_row_indices [L, R + 1], block_col_indices [L, max_nnz] (padded with -1)."""
    rows = np.stack([np.concatenate([[0], np.cumsum([len(r) for r in lay])]) for lay in layouts]).astype(np.int32)
    nnz = max(sum(len(r) for r in lay) for lay in layouts)
    cols = -np.ones((len(layouts), nnz), np.int32)
    for i, lay in enumerate(layouts):
        c = [col for r in lay for col in r]
        cols[i, : len(c)] = c
    return rows, cols


def rotate(x, pos, cos, sin, interleaved):
    """x [B, n, S, H] rotated at positions pos [B, S] by the caches' first half-widths."""
    half = cos.shape[1]
    c, s = cos[pos][:, None].astype(np.float32), sin[pos][:, None].astype(np.float32)
    r = x[..., : 2 * half].astype(np.float32)
    a, b = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :half], r[..., half:])
    y1, y2 = a * c - b * s, b * c + a * s
    out = np.stack([y1, y2], -1).reshape(r.shape) if interleaved else np.concatenate([y1, y2], -1)
    return np.concatenate([out.astype(x.dtype), x[..., 2 * half :]], -1)


def reference(c):
    """The op's output and present buffers, from its definition."""
    q, k, v = c["q"], c["k"], c["v"]
    b_, s_, _ = q.shape
    nh, kvh, h = c["heads"], c["kv_heads"], c["head"]
    split = lambda x, n: x.reshape(b_, s_, n, h).transpose(0, 2, 1, 3)  # noqa: E731
    if k is None:
        all_ = split(q, nh + 2 * kvh)
        q, k, v = all_[:, :nh], all_[:, nh : nh + kvh], all_[:, nh + kvh :]
    else:
        q, k, v = split(q, nh), split(k, kvh), split(v, kvh)
    lens, total = c["lens"], c["total"]
    prompt = total == s_
    past = np.zeros(b_, int) if prompt else lens - s_
    pos = past[:, None] + np.arange(s_)[None]
    if c["rotary"]:
        q = rotate(q, pos, c["cos"], c["sin"], c["interleaved"])
        k = rotate(k, pos, c["cos"], c["sin"], c["interleaved"])
    pk, pv = c["past_k"].copy(), c["past_v"].copy()
    for b in range(b_):
        pk[b, :, past[b] : past[b] + s_] = k[b]
        pv[b, :, past[b] : past[b] + s_] = v[b]
    rows, cols, bs = c["rows"], c["cols"], c["block"]
    layouts, blocks = rows.shape[0], rows.shape[1] - 1
    table = np.zeros((layouts, blocks, blocks), bool)
    for lay in range(layouts):
        dense_layout = rows[lay, blocks] >= blocks * (blocks + 1) // 2
        for r in range(blocks):
            lo, hi = rows[lay, r], rows[lay, r + 1]
            if dense_layout or hi - lo == r + 1:
                table[lay, r] = True
            else:
                table[lay, r, cols[lay, lo:hi]] = True
    scale = c["scale"] or 1.0 / np.sqrt(h)
    kf, vf, qf = pk.astype(np.float64), pv.astype(np.float64), q.astype(np.float64)
    y = np.zeros((b_, nh, s_, h))
    keys = np.arange(pk.shape[2])
    for b in range(b_):
        for hd in range(nh):
            g, lay = hd // (nh // kvh), hd % layouts
            for s in range(s_):
                p = past[b] + s
                seen = (keys <= p) & (keys < lens[b])
                scores = scale * (kf[b, g] @ qf[b, hd, s])
                listed = table[lay, min(p // bs, blocks - 1), np.minimum(keys // bs, blocks - 1)]
                scores = np.where(listed, scores, np.finfo(np.float32).min)[seen]
                e = np.exp(scores - scores.max())
                y[b, hd, s] = (e / e.sum()) @ vf[b, g][seen]
    out = y.transpose(0, 2, 1, 3).reshape(b_, s_, nh * h).astype(c["dtype"])
    return out, pk, pv


def draw(rng, i):
    """One case's inputs and attributes."""
    t = TensorProto.FLOAT16 if i % 4 == 3 else TensorProto.FLOAT
    dt = NP[t]
    kvh, reps = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    nh = kvh * reps
    head = int(rng.choice([16, 32]))
    bs = int(rng.choice([16, 32]))
    b_ = int(rng.integers(1, 4))
    phase = ["prompt", "decode", "steps"][i % 3]
    s_ = 1 if phase == "decode" else int(rng.integers(2, 40))
    total = s_ if phase == "prompt" else s_ + int(rng.integers(1, 60))
    if phase == "prompt":
        lens = rng.integers(1, s_ + 1, b_)
    else:
        lens = rng.integers(s_, total + 1, b_)
    lens[0] = total
    rows_m = total + int(rng.integers(0, 20))
    blocks = -(-rows_m // bs) + int(rng.integers(0, 2))
    layouts = 2 if nh % 2 == 0 and rng.integers(0, 2) else 1
    kinds = [str(rng.choice(["local", "local", "dense", "odd", "full"])) for _ in range(layouts)]
    rows, cols = csr([layout(rng, blocks, kind) for kind in kinds])
    packed = bool(rng.integers(0, 2))
    rotary = bool(rng.integers(0, 2))
    half = head // 2 if rng.integers(0, 2) else head // 4
    half = half - half % 8 or 8
    f = lambda *shape: rng.standard_normal(shape).astype(dt)  # noqa: E731
    c = dict(dtype=dt, onnx_type=t, heads=nh, kv_heads=kvh, head=head, block=bs, total=total,
             lens=lens.astype(np.int32), rows=rows, cols=cols, rotary=rotary,
             interleaved=bool(rng.integers(0, 2)), scale=float(rng.choice([0.0, 0.3])),
             past_k=f(b_, kvh, rows_m, head), past_v=f(b_, kvh, rows_m, head),
             indices_const=bool(rng.integers(0, 2)))
    if packed:
        c.update(q=f(b_, s_, (nh + 2 * kvh) * head), k=None, v=None)
    else:
        c.update(q=f(b_, s_, nh * head), k=f(b_, s_, kvh * head), v=f(b_, s_, kvh * head))
    if rotary:
        angles = rng.uniform(0, 2 * np.pi, (rows_m + 4, half))
        c.update(cos=np.cos(angles).astype(dt), sin=np.sin(angles).astype(dt))
    c["label"] = (f"{phase} {np.dtype(dt).name} B={b_} S={s_} total={total} lens={list(lens)} heads={nh}/{kvh} "
                  f"head={head} block={bs} layouts={kinds} packed={packed} rotary={rotary}"
                  + (f" half={half} interleaved={c['interleaved']}" if rotary else ""))
    return c


def build(c):
    """The one-node model and its feeds."""
    t = c["onnx_type"]
    feeds = {"query": c["q"]}
    names = ["query", "key", "value", "past_key", "past_value", "block_row_indices", "block_col_indices",
             "total_sequence_length", "key_total_sequence_lengths"]
    if c["k"] is None:
        names[1] = names[2] = ""
    else:
        feeds.update(key=c["k"], value=c["v"])
    feeds.update(past_key=c["past_k"], past_value=c["past_v"], key_total_sequence_lengths=c["lens"],
                 total_sequence_length=np.array(c["total"], np.int32))
    inits = []
    blocks = {"block_row_indices": c["rows"], "block_col_indices": c["cols"]}
    if c["indices_const"]:
        inits += [numpy_helper.from_array(a, n) for n, a in blocks.items()]
    else:
        feeds.update(blocks)
    attrs = dict(num_heads=c["heads"], kv_num_heads=c["kv_heads"], sparse_block_size=c["block"])
    if c["scale"]:
        attrs["scale"] = c["scale"]
    if c["rotary"]:
        names += ["cos_cache", "sin_cache"]
        feeds.update(cos_cache=c["cos"], sin_cache=c["sin"])
        attrs.update(do_rotary=1, rotary_interleaved=int(c["interleaved"]))
    node = helper.make_node("SparseAttention", names, ["output", "present_key", "present_value"], name="sa",
                            domain="com.microsoft", **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
            np.dtype(np.int32): TensorProto.INT32}
    # (The block lists' shapes left open: the bad-input check feeds other ones.)
    shape = lambda n, a: [f"{n}_{i}" for i in range(a.ndim)] if n.startswith("block") else a.shape  # noqa: E731
    inputs = [helper.make_tensor_value_info(n, elem[a.dtype], shape(n, a)) for n, a in feeds.items()]
    b_, s_ = c["q"].shape[:2]
    outputs = [helper.make_tensor_value_info("output", t, [b_, s_, c["heads"] * c["head"]]),
               helper.make_tensor_value_info("present_key", t, c["past_k"].shape),
               helper.make_tensor_value_info("present_value", t, c["past_v"].shape)]
    graph = helper.make_graph([node], "sparse_attention", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString(), feeds


def bound_run(session, feeds, c):
    """A run with present_key/present_value bound to past_key/past_value's buffers."""
    caches = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n].copy()) for n in ("past_key", "past_value")}
    binding = session.io_binding()
    for n, a in feeds.items():
        if n in caches:
            binding.bind_ortvalue_input(n, caches[n])
        else:
            binding.bind_cpu_input(n, a)
    binding.bind_output("output")
    binding.bind_ortvalue_output("present_key", caches["past_key"])
    binding.bind_ortvalue_output("present_value", caches["past_value"])
    session.run_with_iobinding(binding)
    # (Copied: the buffers' views die with them.)
    return binding.copy_outputs_to_cpu()[0], caches["past_key"].numpy().copy(), caches["past_value"].numpy().copy()


def close(got, want, c, what):
    tol = dict(atol=3e-3, rtol=3e-3) if c["dtype"] == np.float16 else dict(atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), err_msg=f"{what}: {c['label']}",
                               **tol)


def test_cases(n, seed):
    rng = np.random.default_rng(seed)
    against_cpu = 0
    for i in range(n):
        c = draw(rng, i)
        model, feeds = build(c)
        want = reference(c)
        s = mlx_session(model)
        assert assigned(s) == {"sa": EP}, f"{assigned(s)}: {c['label']}"
        got = s.run(None, feeds)
        for g, w, what in zip(got, want, ("output", "present_key", "present_value")):
            close(g, w, c, what)
        # (Every other case: each phase in turn, as i % 3 picks it.)
        if i % 2 == 0:
            for g, w, what in zip(bound_run(s, feeds, c), want, ("bound output", "bound present_key",
                                                                  "bound present_value")):
                close(g, w, c, what)
        # The reference against ORT's CPU kernel, where that kernel is dependable.
        if c["dtype"] == np.float32 and (c["lens"] == c["total"]).all():
            cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
            for g, w, what in zip(bound_run(cpu, feeds, c), want, ("CPU EP output", "CPU EP present_key",
                                                                    "CPU EP present_value")):
                close(g, w, c, what)
            against_cpu += 1
    print(f"     {n} cases on the MLX EP; the reference matched ORT's CPU kernel on {against_cpu} of them")
    assert against_cpu >= n // 10, f"only {against_cpu} cases checked the reference against ORT"


def test_bad_inputs():
    """ORT's checks, as errors naming the reason: a layout count that does not divide the heads,
    layouts shorter than total_sequence_length, a key length past the total."""
    rng = np.random.default_rng(7)
    c = draw(rng, 1)
    while c["total"] <= c["block"]:  # (one block must not cover the total, for the second case)
        c = draw(rng, 1)
    c["indices_const"] = False
    cases = [
        ("block_row_indices", lambda f: f.update(block_row_indices=np.zeros((3, f["block_row_indices"].shape[1]),
                                                                             np.int32)), "num_layout"),
        ("short layouts", lambda f: f.update(block_row_indices=f["block_row_indices"][:, :2],
                                             block_col_indices=f["block_col_indices"][:, :1]), "layouts cover"),
        ("key length", lambda f: f["key_total_sequence_lengths"].__setitem__(0, c["total"] + 1),
         "key_total_sequence_lengths"),
    ]
    for what, change, reason in cases:
        model, feeds = build(c)
        feeds = {k: v.copy() for k, v in feeds.items()}
        change(feeds)
        s = mlx_session(model)
        try:
            s.run(None, feeds)
        except Exception as e:  # the run must fail with the reason
            assert reason in str(e), f"{what}: {e}"
        else:
            raise AssertionError(f"{what}: the run did not fail")


def main():
    args = sys.argv[1:]
    n = int(args[args.index("--cases") + 1]) if "--cases" in args else 60
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 2026
    ort.register_execution_provider_library(EP, os.environ["ORT_MLX_EP_LIB"])
    check("SparseAttention against the numpy reference", lambda: test_cases(n, seed))
    check("SparseAttention bad inputs fail the run naming the reason", test_bad_inputs)
    failed = [name for name, e in results if e is not None]
    print(f"{len(results) - len(failed)}/{len(results)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
