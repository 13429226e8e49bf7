//! The plan's in-place outputs (rows written back, at positions known while building or as
//! data) and its decode slot (a growing input replayed by one shapeless trace).

use super::*;

#[test]
fn row_byte_ranges_cover_exactly_the_changed_rows() {
    // [2, 4, 3] f32, axis 1: slice b starts at b * 4 * 12 bytes, a row is 12 bytes.
    let r = row_byte_ranges(&[2, 4, 3], 4, 1, &[(0, 1..2), (1, 2..4)]).unwrap();
    assert_eq!(r, vec![12..24, 72..96]);
    // Rank 4, axis 2: the outer index runs over (batch, head).
    let r = row_byte_ranges(&[2, 2, 5, 2], 2, 2, &[(3, 4..5)]).unwrap();
    assert_eq!(r, vec![(3 * 5 + 4) * 4..(3 * 5 + 5) * 4]);
    assert!(row_byte_ranges(&[2, 4, 3], 4, 1, &[(2, 0..1)]).is_err());
    assert!(row_byte_ranges(&[2, 4, 3], 4, 1, &[(0, 3..5)]).is_err());
    assert!(row_byte_ranges(&[2, 4, 3], 4, 3, &[]).is_err());
}

fn set_row_plan(compile: bool) -> (Plan, Arc<SessionStats>) {
    let registry = Registry::build(&[&SET_ROW]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let mut n = node("SetRow", ["cache", "row"], "present");
    n.inputs.push(value("pos"));
    let plan = make_plan(&registry, vec![n], &["cache", "row", "pos"], &["present"], vec![], &stats, compile).unwrap();
    (plan, stats)
}

#[test]
fn in_place_updates_carry_only_the_changed_rows() {
    let _g = mlx::lock();
    let (plan, stats) = set_row_plan(true);
    let cache = Array::from_slice(&[0.0f32; 2 * 4 * 3], &[2, 4, 3]).unwrap();
    let row = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1, 3]).unwrap();
    let pos = Array::from_slice(&[1i64, 3], &[2]).unwrap();
    let run = plan.run(vec![cache, row, pos]).unwrap();
    // The host read inside the compiled trace sent the partition to the eager path.
    assert!(matches!(plan.mode(), Mode::Eager(ref r) if r.contains("read on the host")), "{:?}", plan.mode());
    assert!(stats.summary().contains("compiled run failed"));
    assert_eq!(run.write_backs.len(), 1);
    let wb = &run.write_backs[0];
    assert_eq!((wb.input, wb.output.as_str()), (0, "present"));
    assert_eq!(wb.chunks, vec![(12..24, 12), (48 + 36..48 + 48, 48 + 36)]);
    let bytes = wb.array.host_bytes().unwrap();
    let floats: Vec<f32> = bytes.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(&floats[3..6], &[1.0, 2.0, 3.0]);
    assert_eq!(&floats[12 + 9..24], &[4.0, 5.0, 6.0]);
    assert_eq!(run.outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap(), floats);
}

#[test]
fn rows_at_data_positions_are_written_back_from_compiled_runs() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&SET_ROW_AT]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let mut n = node("SetRowAt", ["cache", "row"], "present");
    n.inputs.push(value("pos"));
    let plan = make_plan(&registry, vec![n], &["cache", "row", "pos"], &["present"], vec![], &stats, true).unwrap();
    let cache = Array::from_slice(&[0.0f32; 2 * 4 * 3], &[2, 4, 3]).unwrap();
    let row = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1, 3]).unwrap();
    for (run_no, positions) in [[1i64, 3], [0, 2]].iter().enumerate() {
        let pos = Array::from_slice(positions, &[2]).unwrap();
        let run = plan.run(vec![cache.clone(), row.clone(), pos]).unwrap();
        assert_eq!(plan.mode(), Mode::ShapeKeyed, "stays compiled");
        assert_eq!(count(&stats.traces), 1, "run {run_no}: one trace serves both");
        assert_eq!(run.write_backs.len(), 1);
        let wb = &run.write_backs[0];
        assert_eq!((wb.input, wb.output.as_str()), (0, "present"));
        // Rows of 12 bytes; batch 1 starts 48 bytes in; the source holds just the 2 new rows.
        let (p0, p1) = (positions[0] as usize, positions[1] as usize);
        assert_eq!(wb.chunks, vec![(0..12, p0 * 12), (12..24, 48 + p1 * 12)]);
        let src: Vec<f32> = wb.array.to_vec(&Stream::cpu().unwrap()).unwrap();
        assert_eq!(src, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let full = run.outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap();
        assert_eq!(&full[p0 * 3..p0 * 3 + 3], &[1.0, 2.0, 3.0]);
        assert_eq!(&full[12 + p1 * 3..12 + p1 * 3 + 3], &[4.0, 5.0, 6.0]);
    }
}

/// Several updates of several dtypes with a data check, in one compiled run: the rows are
/// packed per dtype and the starts and the check's flag read at once, each update written
/// from its own place in the packed rows; a failed check still fails the run.
#[test]
fn packed_rows_of_several_updates_and_dtypes_keep_each_update_apart() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&SET_ROW_AT, &SET_ROW_AT_CHECKED]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let mut nodes = Vec::new();
    for (op, cache, row, out) in
        [("SetRowAt", "a", "ra", "pa"), ("SetRowAtChecked", "b", "rb", "pb"), ("SetRowAt", "c", "rc", "pc")]
    {
        let mut n = node(op, [cache, row], out);
        n.inputs.push(value("pos"));
        nodes.push(n);
    }
    let inputs = ["a", "ra", "b", "rb", "c", "rc", "pos"];
    let plan = make_plan(&registry, nodes, &inputs, &["pa", "pb", "pc"], vec![], &stats, true).unwrap();
    let f32s = |v: &[f32], shape: &[i64]| Array::from_slice(v, shape).unwrap();
    let halves = |v: &[f32], shape: &[i64]| {
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        Array::from_slice(&h, shape).unwrap()
    };
    let args = |pos: [i64; 2]| {
        vec![
            f32s(&[0.0; 8], &[2, 4, 1]),
            f32s(&[1.0, 2.0], &[2, 1, 1]),
            halves(&[0.0; 8], &[2, 4, 1]),
            halves(&[3.0, 4.0], &[2, 1, 1]),
            f32s(&[0.0; 8], &[2, 4, 1]),
            f32s(&[5.0, 6.0], &[2, 1, 1]),
            Array::from_slice(&pos, &[2]).unwrap(),
        ]
    };
    let run = plan.run(args([1, 3])).unwrap();
    assert_eq!(plan.mode(), Mode::ShapeKeyed, "stays compiled");
    assert_eq!(run.write_backs.len(), 3);
    let cpu = Stream::cpu().unwrap();
    for (wb, (input, want)) in run.write_backs.iter().zip([(0, [1.0f32, 2.0]), (2, [3.0, 4.0]), (4, [5.0, 6.0])]) {
        assert_eq!(wb.input, input);
        let item = if input == 2 { 2 } else { 4 };
        // Batch 0's row to position 1, batch 1's to position 3 (4 rows per batch).
        assert_eq!(wb.chunks.iter().map(|c| c.1).collect::<Vec<_>>(), vec![item, (4 + 3) * item]);
        let got: Vec<f32> = if input == 2 {
            let bytes = wb.array.to_vec::<half::f16>(&cpu).unwrap();
            wb.chunks.iter().map(|(r, _)| bytes[r.start / 2].to_f32()).collect()
        } else {
            let bytes = wb.array.to_vec::<f32>(&cpu).unwrap();
            wb.chunks.iter().map(|(r, _)| bytes[r.start / 4]).collect()
        };
        assert_eq!(got, want, "update of input {input}");
    }
    let err = plan.run(args([1, 4])).err().expect("a position past the cache fails the run");
    assert!(err.to_string().contains("a position is outside the cache"), "{err}");
    assert_eq!(count(&stats.traces), 1, "one trace serves both runs");
}

/// `x [1, T]` -> `op` -> `y`, with `T` growing by one per run.
fn growing_runs(lowering: &'static dyn Lowering, axes: bool) -> (Vec<Vec<f32>>, Arc<SessionStats>, Plan) {
    let registry = Registry::build(&[lowering, &MUL]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let mut first = node("Mul", ["x", "x"], "sq");
    first.name = "square".into();
    let mut n = node(lowering.op_type(), ["sq", "sq"], "y");
    n.inputs.truncate(1);
    if axes {
        n.attributes.insert("axes".into(), crate::graph::AttrValue::Ints(vec![1]));
    }
    let plan = make_plan(&registry, vec![first, n], &["x"], &["y"], vec![], &stats, true).unwrap();
    let mut outs = Vec::new();
    for t in 2..7 {
        let x: Vec<f32> = (0..t).map(|i| i as f32).collect();
        let run = plan.run(vec![Array::from_slice(&x, &[1, t]).unwrap()]).unwrap();
        outs.push(run.outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap());
    }
    (outs, stats, plan)
}

#[test]
fn a_growing_input_replays_one_decode_trace_when_every_consumer_handles_it() {
    let _g = mlx::lock();
    let (outs, stats, _plan) = growing_runs(&REDUCE_SUM, true);
    let expected: Vec<Vec<f32>> = (2..7).map(|t| vec![(0..t).map(|i| (i * i) as f32).sum()]).collect();
    assert_eq!(outs, expected);
    // Run 1 traces the shape-keyed slot, run 2 (growth seen) the decode slot; 3..5 replay.
    assert_eq!(count(&stats.traces), 2);
    assert_eq!(count(&stats.decode_runs), 4);
    assert!(!stats.summary().contains("no decode slot"), "{}", stats.summary());
}

#[test]
fn a_consumer_that_bakes_a_growing_length_refuses_the_decode_slot() {
    let _g = mlx::lock();
    let (outs, stats, _plan) = growing_runs(&ADD_POSITIONS, false);
    for (k, t) in (2..7).enumerate() {
        let expected: Vec<f32> = (0..t).map(|i| (i * i + i) as f32).collect();
        assert_eq!(outs[k], expected, "length {t}");
    }
    assert_eq!(count(&stats.decode_runs), 0);
    let summary = stats.summary();
    assert!(summary.contains("no decode slot") && summary.contains("AddPositions"), "{summary}");
}

#[test]
fn updates_of_constants_are_plain_outputs() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&SET_ROW]).unwrap();
    let mut n = node("SetRow", ["cache", "row"], "present");
    n.inputs.push(value("pos"));
    let cache = Array::from_slice(&[0.0f32; 6], &[1, 2, 3]).unwrap();
    let plan = make_plan(
        &registry,
        vec![n],
        &["row", "pos"],
        &["present"],
        vec![("cache", cache)],
        &Arc::new(SessionStats::default()),
        false,
    )
    .unwrap();
    let row = Array::from_slice(&[1.0f32; 3], &[1, 1, 3]).unwrap();
    let pos = Array::from_slice(&[1i64], &[1]).unwrap();
    let run = plan.run(vec![row, pos]).unwrap();
    assert!(run.write_backs.is_empty(), "no ORT buffer to share");
    let got = run.outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap();
    assert_eq!(got, vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
}

/// `m [1, T]` (growing, an attention mask) -> ReduceSum -> `s`; `x [1, 4]` multiplied by `s`
/// and then by itself three times: the decode slot splits off the sum as a compiled prologue
/// and replays one fixed-shape graph for the rest, whatever `T`.
#[test]
fn a_small_growing_input_is_split_off_and_the_rest_replays_one_fixed_shape_graph() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&REDUCE_SUM, &MUL]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let plan = mask_then_muls(&registry, "ReduceSum", &stats);
    let x = [1.0f32, 2.0, -1.0, 0.5];
    for t in 2..8 {
        let m: Vec<f32> = (0..t).map(|i| (i % 3) as f32).collect();
        let inputs = vec![Array::from_slice(&x, &[1, 4]).unwrap(), Array::from_slice(&m, &[1, t]).unwrap()];
        let y = plan.run(inputs).unwrap().outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap();
        let s: f32 = m.iter().sum();
        assert_eq!(y, x.iter().map(|v| v * s * v * v * v).collect::<Vec<_>>(), "length {t}");
    }
    // Run 1 traces the exact shapes; run 2 (growth seen) the split graph, which runs 3..6 replay.
    assert_eq!(count(&stats.traces), 2, "{}", stats.summary());
    assert_eq!((count(&stats.split_runs), count(&stats.decode_runs)), (5, 0), "{}", stats.summary());
    assert!(stats.summary().contains("decode slot split: 5 runs"), "{}", stats.summary());
}

/// [`SumAxis1`] with its input checked to hold no negative value (a failed check fails the
/// run).
struct SumAxis1Checked;
impl Lowering for SumAxis1Checked {
    fn op_type(&self) -> &'static str {
        "SumChecked"
    }
    fn opsets(&self) -> std::ops::RangeInclusive<i32> {
        1..=i32::MAX
    }
    fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
        Ok(())
    }
    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        let (m, s) = (ctx.input(0)?.clone(), ctx.stream());
        let zero = mlx::ops::scalar(0.0, m.dtype(), s)?;
        let ok = mlx::ops::greater_equal(&m, &zero, s)?;
        ctx.check(&ok, "a negative mask value")?;
        REDUCE_SUM.lower(ctx, node)
    }
    fn growth(&self, q: &crate::growth::GrowthQuery<'_>) -> crate::growth::GrowthResult {
        crate::growth::reduction(q, &[1], 2)
    }
}
static SUM_CHECKED: SumAxis1Checked = SumAxis1Checked;

/// The split's prologue (compiled) carries its nodes' data checks: a run whose growing input
/// fails one is handed to the shapeless slot, which fails it naming the node; the next good
/// run is served by the split again.
#[test]
fn a_failed_check_in_the_split_prologue_fails_that_run_only() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&SUM_CHECKED, &MUL]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let plan = mask_then_muls(&registry, "SumChecked", &stats);
    let x = [1.0f32, 2.0, -1.0, 0.5];
    let run = |m: &[f32]| {
        let inputs = vec![Array::from_slice(&x, &[1, 4]).unwrap(), Array::from_slice(m, &[1, m.len() as i64]).unwrap()];
        plan.run(inputs).map(|r| r.outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap())
    };
    let expect = |m: &[f32]| {
        let s: f32 = m.iter().sum();
        x.iter().map(|v| v * s * v * v * v).collect::<Vec<_>>()
    };
    for t in 2..6 {
        let m: Vec<f32> = (0..t).map(|i| (i % 3) as f32).collect();
        assert_eq!(run(&m).unwrap(), expect(&m), "length {t}");
    }
    assert_eq!(count(&stats.split_runs), 3, "{}", stats.summary());
    let bad: Vec<f32> = vec![1.0, 0.0, -2.0, 1.0, 1.0, 1.0];
    let err = run(&bad).expect_err("a negative mask value fails the run");
    assert!(err.0.contains("SumChecked_node") && err.0.contains("a negative mask value"), "{err}");
    assert_eq!(count(&stats.split_runs), 3, "the failed run was not the split's");
    let good: Vec<f32> = vec![1.0; 7];
    assert_eq!(run(&good).unwrap(), expect(&good));
    assert_eq!(count(&stats.split_runs), 4, "the split serves the next good run: {}", stats.summary());
}

/// `sum(m) * rows(m)`: the row count baked into the graph as a constant (what a lowering may
/// do with a dimension that does not grow), the growing axis reduced.
struct SumTimesRows;
impl Lowering for SumTimesRows {
    fn op_type(&self) -> &'static str {
        "SumTimesRows"
    }
    fn opsets(&self) -> std::ops::RangeInclusive<i32> {
        1..=i32::MAX
    }
    fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
        Ok(())
    }
    fn lower(&self, ctx: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
        let (m, s) = (ctx.input(0)?.clone(), ctx.stream());
        let rows = mlx::ops::scalar(m.shape()[0] as f64, m.dtype(), s)?;
        // (Dims kept: a shapeless trace then bakes nothing but the constant.)
        Ok(vec![mlx::ops::multiply(&mlx::ops::sum_axes(&m, &[0, 1], true, s)?, &rows, s)?])
    }
    fn growth(&self, q: &crate::growth::GrowthQuery<'_>) -> crate::growth::GrowthResult {
        crate::growth::reduction(q, &[0, 1], 2)
    }
}
static SUM_TIMES_ROWS: SumTimesRows = SumTimesRows;

/// The split's compiled prologue is keyed by the dimensions that do not grow: after the mask's
/// row count changes (a new batch), its next steady steps trace the prologue again (right
/// values, served by the split) rather than replay the one traced for the old count (whose
/// boundary no longer fits the split: every such step missed it).
#[test]
fn the_compiled_prologue_is_traced_again_for_another_row_count() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&SUM_TIMES_ROWS, &MUL]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let plan = mask_then_muls(&registry, "SumTimesRows", &stats);
    let x = [1.0f32, 2.0, -1.0, 0.5];
    let run = |rows: i64, t: i64| {
        let m: Vec<f32> = (0..rows * t).map(|i| (i % 3) as f32).collect();
        let inputs = vec![Array::from_slice(&x, &[1, 4]).unwrap(), Array::from_slice(&m, &[rows, t]).unwrap()];
        let y = plan.run(inputs).unwrap().outputs[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap();
        let s = m.iter().sum::<f32>() * rows as f32;
        assert_eq!(y, x.iter().map(|v| v * s * v * v * v).collect::<Vec<_>>(), "{rows} rows of {t}");
    };
    for t in 2..6 {
        run(1, t);
    }
    let split = count(&stats.split_runs);
    assert!(split >= 2, "{}", stats.summary());
    // A new batch of two rows (the mask shrinks), then its steady steps.
    for t in 2..6 {
        run(2, t);
    }
    assert!(count(&stats.split_runs) > split, "the new batch's steps ran split: {}", stats.summary());
}

/// `op(m) -> s` over the growing input `m`, then `y = x * s * x * x * x` (four Muls) over the
/// fixed `x [1, 4]`: a small prologue the split decode slot cuts off, and a graph after it.
fn mask_then_muls(registry: &Registry, op: &str, stats: &Arc<SessionStats>) -> Plan {
    let mut sum = node(op, ["m", "m"], "s");
    sum.inputs.truncate(1);
    let mut nodes = vec![sum];
    for (k, (a, out)) in [("x", "a"), ("a", "b"), ("b", "c"), ("c", "y")].into_iter().enumerate() {
        let mut n = node("Mul", [a, if k == 0 { "s" } else { "x" }], out);
        n.name = format!("mul{k}");
        nodes.push(n);
    }
    make_plan(registry, nodes, &["x", "m"], &["y"], vec![], stats, true).unwrap()
}
