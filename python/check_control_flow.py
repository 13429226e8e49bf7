"""Control flow on the MLX EP, checked the way users run it (ONNX Runtime 1.31.1 from PyPI
with the plugin registered): Scan in its forms (axes, directions, several scan inputs and
outputs, no iterations; opset 8's batch axis and sequence lengths), Loop in its forms (trip count, condition, early exit by the body's
condition, no iterations, scan outputs), and two model shapes from real audio models, each of which must run
as ONE MLX partition and match ORT's CPU EP (allclose, rtol 1e-3, atol 1e-4):
- a voice-activity detector: a sample-rate If whose branches hold a Conv front-end and a
  nested If around an LSTM with carried states;
- an audio front-end: a Scan over frames (DC removal, window), DFT, power, mel filters, log.

Run by `cargo xtask test` with ORT_MLX_EP_LIB pointing at the built plugin."""

import os
import re
import subprocess
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from check_plugin import EP, assigned, check, cpu_session, mlx_session, model, results

RTOL, ATOL = 1e-3, 1e-4


def partitions(session):
    """The MLX EP's partitions (ORT's assignment info lists one subgraph per partition)."""
    return [sg for sg in session.get_provider_graph_assignment_info() if sg.ep_name == EP]


def compare(m, feeds, one_partition=True):
    s = mlx_session(m)
    a = assigned(s)
    assert a and set(a.values()) == {EP}, f"nodes left to other EPs: {a}"
    if one_partition:
        assert len(partitions(s)) == 1, f"{len(partitions(s))} MLX partitions"
    ref = cpu_session(m)
    for feed in feeds:
        for got, want in zip(s.run(None, feed), ref.run(None, feed)):
            assert got.shape == want.shape, (got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    return s


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


F = TensorProto.FLOAT


def scan_model(in_dirs, in_axes, out_dirs, out_axes, steps, opset=17):
    """A running sum `acc` over two scan inputs (rows of `a` and `b` along their axes); scan
    outputs: the running sum and the elementwise product of the two slices."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "a_t"], ["s1"]),
            helper.make_node("Add", ["s1", "b_t"], ["acc_out"]),
            helper.make_node("Mul", ["a_t", "b_t"], ["prod"]),
            helper.make_node("Identity", ["acc_out"], ["acc_copy"]),
        ],
        "body",
        [vi("acc_in", F, [4]), vi("a_t", F, [4]), vi("b_t", F, [4])],
        [vi("acc_out", F, [4]), vi("acc_copy", F, [4]), vi("prod", F, [4])],
    )
    a_shape = [steps, 4] if in_axes[0] in (0, -2) else [4, steps]
    b_shape = [steps, 4] if in_axes[1] in (0, -2) else [4, steps]
    out_shape = lambda axis: [steps, 4] if axis in (0, -2) else [4, steps]  # noqa: E731
    node = helper.make_node(
        "Scan",
        ["acc0", "a", "b"],
        ["acc", "sums", "prods"],
        name="scan",
        body=body,
        num_scan_inputs=2,
        scan_input_directions=in_dirs,
        scan_input_axes=in_axes,
        scan_output_directions=out_dirs,
        scan_output_axes=out_axes,
    )
    return model(
        [helper.make_node("Relu", ["x"], ["acc0"], name="relu"), node],
        [vi("x", F, [4]), vi("a", F, a_shape), vi("b", F, b_shape)],
        [vi("acc", F, [4]), vi("sums", F, out_shape(out_axes[0])), vi("prods", F, out_shape(out_axes[1]))],
        opset=opset,
    )


def test_scan_forms():
    rng = np.random.default_rng(0)
    forms = [
        ([0, 0], [0, 0], [0, 0], [0, 0]),
        ([1, 0], [0, 1], [0, 1], [1, 0]),
        ([1, 1], [-1, -2], [1, 1], [-1, -2]),
    ]
    for in_dirs, in_axes, out_dirs, out_axes in forms:
        m = scan_model(in_dirs, in_axes, out_dirs, out_axes, steps=5)
        shape = lambda axis: (5, 4) if axis in (0, -2) else (4, 5)  # noqa: E731
        feeds = [
            {
                "x": rng.standard_normal(4).astype(np.float32),
                "a": rng.standard_normal(shape(in_axes[0])).astype(np.float32),
                "b": rng.standard_normal(shape(in_axes[1])).astype(np.float32),
            }
            for _ in range(2)
        ]
        compare(m, feeds)


def scan8_body(combine, scanned):
    """Opset 8's Scan body over one entry's step: `acc_out = combine(acc_in + a_t, b_t)`, and
    the node `scanned` (reading the step's values) as the scan output."""
    return helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "a_t"], ["s1"]),
            helper.make_node(combine, ["s1", "b_t"], ["acc_out"]),
            scanned,
        ],
        "body",
        [vi("acc_in", F, [4]), vi("a_t", F, [4]), vi("b_t", F, [4])],
        [vi("acc_out", F, [4]), vi(scanned.output[0], F, [4])],
    )


def test_scan8_batch_forms():
    """Opset 8's Scan: a batch axis on every input, the body on one entry's step; the running
    sum over two scan inputs, one of them reversed (`directions`), against the CPU EP."""
    body = scan8_body("Add", helper.make_node("Mul", ["a_t", "b_t"], ["prod"]))
    rng = np.random.default_rng(8)
    for directions in ([0, 0], [1, 0], [0, 1]):
        node = helper.make_node(
            "Scan", ["", "acc0", "a", "b"], ["acc", "prods"], name="scan8", body=body, num_scan_inputs=2, directions=directions
        )
        m = model(
            [helper.make_node("Relu", ["x"], ["acc0"], name="relu"), node],
            [vi("x", F, [3, 4]), vi("a", F, [3, 5, 4]), vi("b", F, [3, 5, 4])],
            [vi("acc", F, [3, 4]), vi("prods", F, [3, 5, 4])],
            opset=8,
        )
        feeds = [{n: rng.standard_normal(sh).astype(np.float32) for n, sh in (("x", (3, 4)), ("a", (3, 5, 4)), ("b", (3, 5, 4)))}]
        compare(m, feeds)


def test_scan8_sequence_lens():
    """Opset 8's Scan with `sequence_lens`: entries of different lengths (each at most the
    time steps), one scan input reversed within its entry's length; final states after each
    entry's length, scan outputs zero past it. A length outside [1, time] fails the run, as
    on the CPU EP."""
    body = scan8_body("Mul", helper.make_node("Sub", ["acc_out", "a_t"], ["diff"]))
    rng = np.random.default_rng(9)
    i64 = TensorProto.INT64
    for directions in ([0, 0], [1, 0], [0, 1], [1, 1]):
        node = helper.make_node(
            "Scan", ["lens", "acc0", "a", "b"], ["acc", "diffs"], name="scan8", body=body, num_scan_inputs=2, directions=directions
        )
        m = model(
            [node],
            [vi("lens", i64, [4]), vi("acc0", F, [4, 4]), vi("a", F, [4, 6, 4]), vi("b", F, [4, 6, 4])],
            [vi("acc", F, [4, 4]), vi("diffs", F, [4, 6, 4])],
            opset=8,
        )
        feeds = []
        for lens in ([1, 6, 3, 5], [6, 6, 6, 6], [2, 1, 1, 4]):
            feed = {n: rng.standard_normal(sh).astype(np.float32) for n, sh in (("acc0", (4, 4)), ("a", (4, 6, 4)), ("b", (4, 6, 4)))}
            feed["lens"] = np.array(lens, np.int64)
            feeds.append(feed)
        s = compare(m, feeds)
    for bad in ([0, 6, 3, 5], [1, 7, 3, 5]):
        feed = dict(feeds[0], lens=np.array(bad, np.int64))
        try:
            s.run(None, feed)
        except Exception as e:
            assert "sequence_lens" in str(e) and "'scan8'" in str(e), e
        else:
            raise AssertionError(f"sequence_lens {bad} ran")


def test_scan_without_iterations():
    m = scan_model([0, 0], [0, 0], [0, 0], [0, 0], steps="T")
    feed = {"x": np.arange(4, dtype=np.float32) - 1, "a": np.zeros((0, 4), np.float32), "b": np.zeros((0, 4), np.float32)}
    s = mlx_session(m)
    assert set(assigned(s).values()) == {EP}, assigned(s)
    acc, sums, prods = s.run(None, feed)
    np.testing.assert_array_equal(acc, np.maximum(feed["x"], 0))
    assert sums.shape == (0, 4) and prods.shape == (0, 4), (sums.shape, prods.shape)


def test_scan_inputs_of_different_lengths_fail_cleanly():
    m = scan_model([0, 0], [0, 0], [0, 0], [0, 0], steps="T")
    s = mlx_session(m)  # without ORT's fallback: the MLX EP's own error
    feed = {"x": np.zeros(4, np.float32), "a": np.zeros((3, 4), np.float32), "b": np.zeros((5, 4), np.float32)}
    try:
        s.run(None, feed)
    except Exception as e:  # the run fails with the reason, naming the node
        assert "scan input 1 has 5 iterations" in str(e) and "'scan'" in str(e), e
    else:
        raise AssertionError("scan inputs of 3 and 5 iterations ran")


def loop_model(with_trip, with_cond, trip_const=None, scan=True, tail=None, passthrough=False):
    """acc += x * (i + 1) each iteration while acc < limit (the body's condition); the scan
    output is each iteration's acc. `trip_const`: the trip count as an initializer; `tail`: an
    op applied to the final acc (names the session apart in summaries); `passthrough`: the
    body hands its condition input back (an Identity) instead of comparing with `limit`."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Add", ["i_f", "one"], ["i1"]),
            helper.make_node("Mul", ["x", "i1"], ["step"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["go_on"]),
            helper.make_node("Identity", ["acc_out"], ["acc_seen"]),
        ],
        "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", F, [3])],
        [vi("go_on", TensorProto.BOOL, []), vi("acc_out", F, [3]), vi("acc_seen", F, [3])],
        [numpy_helper.from_array(np.ones((), np.float32), "one")],
    )
    if passthrough:
        body.node[5].CopyFrom(helper.make_node("Identity", ["cond_in"], ["go_on"]))
    if not scan:
        body.node.pop()
        body.output.pop()
    names = ["trip" if with_trip or trip_const is not None else "", "cond" if with_cond else "", "acc0"]
    outs = ["acc_loop" if tail else "acc"] + (["history"] if scan else [])
    nodes = [helper.make_node("Loop", names, outs, name="loop", body=body)]
    if tail:
        nodes.append(helper.make_node(tail, ["acc_loop"], ["acc"], name="tail"))
    inputs = [vi("x", F, [3]), vi("acc0", F, [3]), vi("limit", F, [])]
    inits = []
    if trip_const is not None:
        inits.append(numpy_helper.from_array(np.array(trip_const, np.int64), "trip"))
    elif with_trip:
        inputs.append(vi("trip", TensorProto.INT64, []))
    if with_cond:
        inputs.append(vi("cond", TensorProto.BOOL, []))
    outputs = [vi("acc", F, [3])] + ([vi("history", F, ["N", 3])] if scan else [])
    return model(nodes, inputs, outputs, inits, opset=17)


def test_loop_passing_its_condition_through():
    """A `for` loop's export: the body hands its condition back; the eager form (a trip count
    that is data) queues the iterations without reading the condition."""
    m = loop_model(True, True, passthrough=True)
    feeds = [{"x": np.array([0.5, 1.0, 2.0], np.float32), "acc0": np.zeros(3, np.float32),
              "limit": np.array(1.0, np.float32), "trip": np.array(trip, np.int64), "cond": np.array(cond)}
             for trip, cond in [(100, True), (3, True), (0, True), (7, False)]]
    compare(m, feeds)


def test_loop_forms():
    rng = np.random.default_rng(3)
    for with_trip, with_cond in [(True, False), (False, True), (True, True)]:
        m = loop_model(with_trip, with_cond)
        feeds = []
        for trip, cond, limit in [(5, True, 1e9), (9, True, 6.0), (0, True, 1e9), (4, False, 1e9)]:
            if not with_trip and limit > 1e8:
                limit = 20.0  # a while loop ends by its condition
            if (trip == 0 and not with_trip) or (not cond and not with_cond):
                continue
            feed = {
                "x": np.abs(rng.standard_normal(3)).astype(np.float32) + 0.1,
                "acc0": rng.standard_normal(3).astype(np.float32),
                "limit": np.array(limit, np.float32),
            }
            if with_trip:
                feed["trip"] = np.array(trip, np.int64)
            if with_cond:
                feed["cond"] = np.array(cond)
            feeds.append(feed)
        compare(m, feeds)


def vad_model():
    """Silero-VAD-shaped: If(sr == 16000) picks a Conv front-end (stride and weights per rate);
    inside, If(use_rnn) runs an LSTM over the conv frames with carried h/c, else a plain tanh."""
    rng = np.random.default_rng(7)
    hidden, channels = 8, 6
    inits = []

    def weight(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    lstm_w, lstm_r, lstm_b = weight("lstm_W", 1, 4 * hidden, channels), weight("lstm_R", 1, 4 * hidden, hidden), weight(
        "lstm_B", 1, 8 * hidden
    )

    def inner_if(tag):
        """If(use_rnn): LSTM over frames [T, 1, C] with the carried states, or tanh with the states passed on."""
        rnn = helper.make_graph(
            [
                helper.make_node(
                    "LSTM",
                    [f"frames_{tag}", lstm_w, lstm_r, lstm_b, "", "h0", "c0"],
                    [f"y_{tag}", f"hn_{tag}", f"cn_{tag}"],
                    hidden_size=hidden,
                ),
                helper.make_node("Squeeze", [f"y_{tag}", "axis1"], [f"seq_{tag}"]),
            ],
            f"rnn_{tag}",
            [],
            [vi(f"seq_{tag}", F, ["T", 1, hidden]), vi(f"hn_{tag}", F, [1, 1, hidden]), vi(f"cn_{tag}", F, [1, 1, hidden])],
        )
        plain = helper.make_graph(
            [
                helper.make_node("MatMul", [f"frames_{tag}", "proj"], [f"p_{tag}"]),
                helper.make_node("Tanh", [f"p_{tag}"], [f"t_{tag}"]),
                helper.make_node("Identity", ["h0"], [f"h_{tag}"]),
                helper.make_node("Identity", ["c0"], [f"c_{tag}"]),
            ],
            f"plain_{tag}",
            [],
            [vi(f"t_{tag}", F, ["T", 1, hidden]), vi(f"h_{tag}", F, [1, 1, hidden]), vi(f"c_{tag}", F, [1, 1, hidden])],
        )
        return helper.make_node(
            "If", ["use_rnn"], [f"seq_out_{tag}", f"h_out_{tag}", f"c_out_{tag}"], then_branch=rnn, else_branch=plain
        )

    def rate_branch(tag, stride):
        w = weight(f"conv_{tag}", channels, 1, 8)
        b = weight(f"conv_b_{tag}", channels)
        return helper.make_graph(
            [
                helper.make_node("Conv", ["x", w, b], [f"conv_out_{tag}"], strides=[stride], pads=[2, 2]),
                helper.make_node("Relu", [f"conv_out_{tag}"], [f"act_{tag}"]),
                # [1, C, T] -> [T, 1, C]: LSTM's sequence layout.
                helper.make_node("Transpose", [f"act_{tag}"], [f"frames_{tag}"], perm=[2, 0, 1]),
                inner_if(tag),
                helper.make_node("ReduceMean", [f"seq_out_{tag}", "axis_last"], [f"score_{tag}"], keepdims=0),
            ],
            f"rate_{tag}",
            [],
            [vi(f"score_{tag}", F, ["T", 1]), vi(f"h_out_{tag}", F, [1, 1, hidden]), vi(f"c_out_{tag}", F, [1, 1, hidden])],
        )

    inits.append(numpy_helper.from_array((rng.standard_normal((channels, hidden)) * 0.3).astype(np.float32), "proj"))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axis_last"))
    inits.append(numpy_helper.from_array(np.array(16000, np.int64), "rate16k"))
    nodes = [
        helper.make_node("Equal", ["sr", "rate16k"], ["is16k"], name="rate_check"),
        helper.make_node(
            "If", ["is16k"], ["score", "hn", "cn"], name="rate_if",
            then_branch=rate_branch("16k", 4), else_branch=rate_branch("8k", 2),
        ),
        helper.make_node("Sigmoid", ["score"], ["prob"], name="prob"),
    ]
    return model(
        nodes,
        [vi("x", F, [1, 1, 64]), vi("sr", TensorProto.INT64, []), vi("use_rnn", TensorProto.BOOL, []),
         vi("h0", F, [1, 1, hidden]), vi("c0", F, [1, 1, hidden])],
        [vi("prob", F, ["T", 1]), vi("hn", F, [1, 1, hidden]), vi("cn", F, [1, 1, hidden])],
        inits,
        opset=18,
    )


def test_vad_shaped_model_is_one_partition():
    rng = np.random.default_rng(8)
    feeds = []
    for sr in (16000, 8000):
        for use_rnn in (True, False):
            feeds.append({
                "x": rng.standard_normal((1, 1, 64)).astype(np.float32),
                "sr": np.array(sr, np.int64),
                "use_rnn": np.array(use_rnn),
                "h0": (rng.standard_normal((1, 1, 8)) * 0.5).astype(np.float32),
                "c0": (rng.standard_normal((1, 1, 8)) * 0.5).astype(np.float32),
            })
    compare(vad_model(), feeds)


def if_select_model():
    """Add > If(c) > Relu with a data condition `c`: then_branch gathers x1 at `idx` (ORT's
    Gather fails an index out of range), else_branch doubles x1[0:2]; both give float [2]."""
    then = helper.make_graph([helper.make_node("Gather", ["x1", "idx"], ["picked"], name="pick", axis=0)],
                             "then", [], [vi("picked", F, [2])])
    other = helper.make_graph(
        [
            helper.make_node("Slice", ["x1", "starts", "ends"], ["head"], name="head"),
            helper.make_node("Mul", ["head", "two"], ["doubled"], name="double"),
        ],
        "else", [], [vi("doubled", F, [2])],
    )
    nodes = [
        helper.make_node("Add", ["x", "one"], ["x1"], name="shift"),
        helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other),
        helper.make_node("Relu", ["y"], ["out"], name="relu"),
    ]
    inits = [
        numpy_helper.from_array(np.ones(1, np.float32), "one"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([2], np.int64), "ends"),
    ]
    return model(
        nodes,
        [vi("x", F, [4]), vi("idx", TensorProto.INT64, [2]), vi("c", TensorProto.BOOL, [])],
        [vi("out", F, [2])],
        inits,
        opset=18,
    )


def if_child():
    """Runs If forms on the MLX EP and checks them against the CPU EP; the parent reads the
    session summaries this process prints."""
    x = np.array([-3.0, 0.5, 2.0, -0.25], np.float32)
    feeds = [
        {"x": x, "idx": np.array([2, 0], np.int64), "c": np.array(True)},
        # Out of range, but read only by the branch not taken: no error.
        {"x": x, "idx": np.array([7, -9], np.int64), "c": np.array(False)},
        {"x": x * 2, "idx": np.array([-1, 1], np.int64), "c": np.array(True)},
    ]
    s = compare(if_select_model(), feeds)
    try:
        s.run(None, {"x": x, "idx": np.array([7, 0], np.int64), "c": np.array(True)})
        failed = None
    except Exception as e:  # ORT's EPFail
        failed = str(e)
    assert failed and "'pick' (Gather)" in failed and "out of range" in failed, failed
    # The VAD-shaped model: its outer If's branches differ in shape (frames per rate).
    rng = np.random.default_rng(3)
    vad = {"x": rng.standard_normal((1, 1, 64)).astype(np.float32), "sr": np.array(8000, np.int64),
           "use_rnn": np.array(True), "h0": np.zeros((1, 1, 8), np.float32), "c0": np.zeros((1, 1, 8), np.float32)}
    plain = dict(vad, use_rnn=np.array(False))
    compare(vad_model(), [vad, vad, plain, plain])
    # A Loop of 5 iterations: its body traced once, replayed 4 times.
    feed = {"x": np.array([0.5, 1.0, 2.0], np.float32), "acc0": np.zeros(3, np.float32),
            "limit": np.array(1e9, np.float32), "trip": np.array(5, np.int64)}
    compare(loop_model(True, False), [feed])
    # A trip count known while building: unrolled into the compiled graph, the body's data
    # condition carried as a flag (the limits end the loop at different iterations or not).
    base = {k: v for k, v in feed.items() if k != "trip"}
    feeds = [dict(base, limit=np.array(limit, np.float32)) for limit in (1e9, 4.0, 12.0, -1.0)]
    compare(loop_model(False, False, trip_const=6, scan=False, tail="Abs"), feeds)
    entering = [dict(f, cond=np.array(True)) for f in feeds] + [dict(feeds[0], cond=np.array(False))]
    compare(loop_model(False, True, trip_const=6, scan=False, tail="Neg"), entering)
    # ... but with scan outputs, whose length is then data, and past the unroll limit: eager.
    compare(loop_model(False, False, trip_const=6, scan=True, tail="Relu"), feeds)
    compare(loop_model(False, False, trip_const=100, scan=False, tail="Sigmoid"), feeds)
    return 0


def test_if_with_a_data_condition_is_compiled():
    env = dict(os.environ, ONNXRUNTIME_EP_MLX_VERBOSE="1")
    child = subprocess.run([sys.executable, __file__, "--if-child"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    sessions = {re.search(r"claimed ops: (.*)", b).group(1): b
                for b in child.stderr.split("session summary")[1:] if "claimed ops" in b}
    assert len(sessions) == 7, child.stderr

    def subgraph_runs(ops):
        found = re.search(r"subgraphs compiled apart: (\d+) replays, (\d+) traces", sessions[ops])
        return found and (int(found.group(1)), int(found.group(2)))

    # The If model: every run compiled (the first traces, the others replay), none eager.
    runs = re.search(r"runs: (\d+) compiled replays, (\d+) eager", sessions["Add x1, If x1, Relu x1"])
    replays, eager = map(int, runs.groups())
    assert eager == 0 and replays >= 2, sessions
    # The VAD-shaped model: the rate If cannot be selected on the device, so the partition
    # runs eagerly (with that reason) and the branch taken runs as a compiled closure of its
    # own, traced once per value of the small values it reads (`use_rnn`, which its nested If
    # then decides while building) and replayed.
    vad = sessions["Equal x1, If x1, Sigmoid x1"]
    assert "cannot be selected on the device" in vad, vad
    assert "a subgraph is built node by node" not in child.stderr, child.stderr
    assert subgraph_runs("Equal x1, If x1, Sigmoid x1") == (2, 2), vad
    # The Loop: its body compiled once, replayed by the other iterations.
    assert subgraph_runs("Loop x1") == (4, 1), sessions["Loop x1"]

    def eager_runs(ops):
        return int(re.search(r"runs: \d+ compiled replays, (\d+) eager", sessions[ops]).group(1))

    # Unrolled: no eager run, whether the trip count comes alone or with a condition.
    assert eager_runs("Abs x1, Loop x1") == 0 and eager_runs("Loop x1, Neg x1") == 0, sessions
    relu, sigmoid = sessions["Loop x1, Relu x1"], sessions["Loop x1, Sigmoid x1"]
    assert eager_runs("Loop x1, Relu x1") > 0 and "their length is data" in relu, relu
    assert eager_runs("Loop x1, Sigmoid x1") > 0 and "100 iterations" in sigmoid, sigmoid


def test_random_generators_in_a_branch_draw_every_run():
    """An If whose branches draw (RandomUniform, RandomNormal): a compiled trace would replay
    the values it drew, so the partition and the branch run eagerly, and every run draws anew
    (a `seed` fixes the sequence: a second session draws the first one's values)."""
    def branch(op, seed):
        extra = {} if seed is None else {"seed": seed}
        node = helper.make_node(op, [], [op.lower()], shape=[64], name=op.lower(), **extra)
        return helper.make_graph([node], op, [], [vi(op.lower(), F, [64])])

    for seed in (None, 3.0):
        m = model(
            [helper.make_node("If", ["c"], ["y"], then_branch=branch("RandomUniform", seed),
                              else_branch=branch("RandomNormal", seed), name="if"),
             helper.make_node("Add", ["y", "x"], ["z"], name="add")],
            [vi("c", TensorProto.BOOL, []), vi("x", F, [64])], [vi("z", F, [64])])
        x = np.zeros(64, np.float32)
        draws = []
        for _ in range(2):
            s = mlx_session(m)
            a = assigned(s)
            assert a and set(a.values()) == {EP}, f"nodes left to other EPs: {a}"
            runs = []
            for c in (True, False):
                runs += [s.run(None, {"c": np.array(c), "x": x})[0] for _ in range(3)]
                if c:
                    assert runs[0].min() >= 0 and runs[0].max() < 1, runs[0]
            for i in (0, 3):
                assert not np.array_equal(runs[i], runs[i + 1]) and not np.array_equal(runs[i + 1], runs[i + 2]), (seed, runs)
            draws.append(runs)
        same = all(np.array_equal(a, b) for a, b in zip(*draws))
        assert same == (seed is not None), (seed, draws)
    return 0


def frontend_model(frame=32, frames=12, mels=10):
    """Speaker-embedding-front-end-shaped: frames of the waveform, a Scan that removes each
    frame's mean and applies a Hann window, a one-sided DFT, power, mel filters, log."""
    rng = np.random.default_rng(11)
    bins = frame // 2 + 1
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(frame) / frame)).astype(np.float32)
    mel = np.abs(rng.standard_normal((bins, mels))).astype(np.float32) * 0.1
    body = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["frame_t", "axes0"], ["mean"], keepdims=1),
            helper.make_node("Sub", ["frame_t", "mean"], ["centred"]),
            helper.make_node("Mul", ["centred", "window"], ["windowed"]),
            helper.make_node("Add", ["count_in", "one"], ["count_out"]),
        ],
        "per_frame",
        [vi("count_in", F, [1]), vi("frame_t", F, [frame])],
        [vi("count_out", F, [1]), vi("windowed", F, [frame])],
    )
    nodes = [
        helper.make_node("Reshape", ["wave", "frame_shape"], ["framed"], name="frame"),
        helper.make_node("Scan", ["count0", "framed"], ["count", "windowed_frames"], name="frames_scan",
                         body=body, num_scan_inputs=1),
        helper.make_node("Unsqueeze", ["windowed_frames", "axes_last"], ["real"], name="as_real"),
        helper.make_node("DFT", ["real", "", "axis1"], ["spectrum"], name="dft", onesided=1),
        helper.make_node("Mul", ["spectrum", "spectrum"], ["squares"], name="square"),
        helper.make_node("ReduceSum", ["squares", "axes_last"], ["power"], name="power", keepdims=0),
        helper.make_node("MatMul", ["power", "mel"], ["mel_power"], name="mel"),
        helper.make_node("Add", ["mel_power", "eps"], ["floored"], name="floor"),
        helper.make_node("Log", ["floored"], ["fbank"], name="log"),
    ]
    inits = [
        numpy_helper.from_array(np.array([frames, frame], np.int64), "frame_shape"),
        numpy_helper.from_array(np.zeros(1, np.float32), "count0"),
        numpy_helper.from_array(np.ones(1, np.float32), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes_last"),
        numpy_helper.from_array(np.array(1, np.int64), "axis1"),
        numpy_helper.from_array(window, "window"),
        numpy_helper.from_array(mel, "mel"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    return model(
        nodes,
        [vi("wave", F, [frames * frame])],
        [vi("fbank", F, [frames, mels]), vi("count", F, [1])],
        inits,
        opset=20,
    )


def test_audio_frontend_is_one_partition():
    rng = np.random.default_rng(12)
    feeds = [{"wave": (rng.standard_normal(12 * 32) * 0.3).astype(np.float32)} for _ in range(2)]
    compare(frontend_model(), feeds)


def bench(repeat=50):
    """`--bench`: the two model shapes on ORT's CPU EP and the MLX EP, first run and the median
    of `repeat` runs each (on a GPU machine: `bash gpu/run.sh controlflow`)."""
    import time

    rng = np.random.default_rng(5)
    cases = {
        "VAD-shaped (If > Conv, If > LSTM)": (vad_model(), {
            "x": rng.standard_normal((1, 1, 64)).astype(np.float32), "sr": np.array(16000, np.int64),
            "use_rnn": np.array(True), "h0": np.zeros((1, 1, 8), np.float32), "c0": np.zeros((1, 1, 8), np.float32),
        }),
        "audio front-end (Scan, DFT, mel)": (frontend_model(), {"wave": rng.standard_normal(12 * 32).astype(np.float32)}),
    }
    # Loops of a constant trip count: unrolled into the compiled graph up to 64 iterations,
    # eager beyond (the body compiled apart, the condition read per iteration): the cost per
    # iteration on each side of the threshold.
    loop_feed = {"x": np.array([0.5, 1.0, 2.0], np.float32), "acc0": np.zeros(3, np.float32),
                 "limit": np.array(1e9, np.float32)}
    for trip in (16, 64, 65, 256):
        cases[f"Loop, {trip} iterations ({'unrolled' if trip <= 64 else 'eager'})"] = (
            loop_model(False, False, trip_const=trip, scan=False), loop_feed)
    cases["Loop, 256 iterations, the condition passed through (eager, not read)"] = (
        loop_model(False, False, trip_const=256, scan=False, passthrough=True), loop_feed)
    for name, (m, feed) in cases.items():
        times = {}
        for ep, make in (("CPU EP", cpu_session), ("MLX EP", mlx_session)):
            s = make(m)
            t0 = time.perf_counter()
            first = s.run(None, feed)
            first_ms = (time.perf_counter() - t0) * 1e3
            runs = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                s.run(None, feed)
                runs.append((time.perf_counter() - t0) * 1e3)
            times[ep] = (first_ms, float(np.median(runs)), first)
        (cf, cm, cpu_out), (mf, mm, mlx_out) = times["CPU EP"], times["MLX EP"]
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(mlx_out, cpu_out))
        print(f"{name}: CPU EP {cm:.3f} ms, MLX EP {mm:.3f} ms, MLX EP / CPU EP {mm / cm:.2f}; "
              f"first run CPU {cf:.1f} ms, MLX {mf:.1f} ms; max abs diff {diff:.2e}")
    return 0


def main():
    lib = os.environ.get("ORT_MLX_EP_LIB")
    if not lib or not os.path.exists(lib):
        print(f"ORT_MLX_EP_LIB must point at the built plugin (got {lib!r})")
        return 2
    ort.register_execution_provider_library("MLX", lib)
    if sys.argv[1:] == ["--bench"]:
        return bench()
    if sys.argv[1:] == ["--if-child"]:
        return if_child()
    check("Scan: scan axes, directions, two scan inputs and outputs, on MLX, match", test_scan_forms)
    check("Scan of opset 8: a batch axis, directions, on MLX, match", test_scan8_batch_forms)
    check("Scan of opset 8 with sequence_lens: entries of different lengths, reversed inputs, on MLX, match; "
          "a length outside [1, time] fails the run", test_scan8_sequence_lens)
    check("Scan with no iterations: initial states, empty scan outputs", test_scan_without_iterations)
    check("Scan inputs of different lengths: a clear error naming the node", test_scan_inputs_of_different_lengths_fail_cleanly)
    check("Loop: trip count, condition, early exit, no iterations, scan output, on MLX, match", test_loop_forms)
    check("Loop whose body passes its condition through: no read per iteration, matches", test_loop_passing_its_condition_through)
    check("VAD-shaped model (If > Conv, nested If > LSTM): one MLX partition, matches", test_vad_shaped_model_is_one_partition)
    check("audio front-end (Scan over frames, DFT, mel, log): one MLX partition, matches", test_audio_frontend_is_one_partition)
    check("If with a data condition: compiled, both branches selected on the device, a check of the branch "
          "not taken holds; branches of other shapes: eager, with the reason, the branch taken compiled apart; "
          "a Loop's body compiled once; short Loops unrolled", test_if_with_a_data_condition_is_compiled)
    check("Random generators in an If's branches: every run draws anew (a seed fixes the sequence per session)",
          test_random_generators_in_a_branch_draw_every_run)
    failed = sum(1 for _, e in results if e is not None)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
