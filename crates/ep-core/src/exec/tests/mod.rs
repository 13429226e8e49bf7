//! The plan's behaviour end to end on test lowerings: sources, compile modes and their caches,
//! the decode slot, data checks, in-place updates, constants and subgraphs.

use super::*;
use crate::graph::ValueInfo;
use crate::lowering::Decline;
use crate::lowering::LowerCtx;
use crate::mlx::{self, Array, Dtype, Stream};

mod checks;
mod retry;
mod rows_and_decode;

/// A test lowering: an op name, a compile safety and a lowering function; claims everything.
struct TestLowering {
    op: &'static str,
    safety: CompileSafety,
    lower: fn(&mut LowerCtx<'_>, &NodeInfo) -> Result<Vec<Array>>,
}
impl Lowering for TestLowering {
    fn op_type(&self) -> &'static str {
        self.op
    }
    fn opsets(&self) -> std::ops::RangeInclusive<i32> {
        1..=i32::MAX
    }
    fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
        Ok(())
    }
    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        (self.lower)(ctx, node)
    }
    fn compile_safety(&self) -> CompileSafety {
        self.safety
    }
}

macro_rules! binary {
    ($name:ident, $op:literal, $f:path, $safety:ident) => {
        static $name: TestLowering = TestLowering {
            op: $op,
            safety: CompileSafety::$safety,
            lower: |ctx, _| Ok(vec![$f(ctx.input(0)?, ctx.input(1)?, ctx.stream())?]),
        };
    };
}
binary!(ADD, "Add", mlx::ops::add, Shapeless);
binary!(MUL, "Mul", mlx::ops::multiply, Shapeless);
binary!(SUB_KEYED, "Sub", mlx::ops::subtract, ShapeKeyed);
binary!(DIV_NEVER, "Div", mlx::ops::divide, Never);

/// `a @ transpose(b)`, transposing through the derived-constant cache.
static MATMUL_TRANS_B: TestLowering = TestLowering {
    op: "MatMulTransB",
    safety: CompileSafety::Shapeless,
    lower: |ctx, _| {
        let bt = ctx.derived(1, "transpose", |b, s| Ok(mlx::ops::transpose(b, s)?))?;
        Ok(vec![mlx::ops::matmul(ctx.input(0)?, &bt, ctx.stream())?])
    },
};

/// KV-cache style: `cache[b, pos[b]] = row[b]`, declared an in-place update of the cache.
static SET_ROW: TestLowering = TestLowering {
    op: "SetRow",
    safety: CompileSafety::Shapeless,
    lower: |ctx, _| {
        let s = ctx.stream();
        let (cache, row) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
        let positions = ctx.host_i64(2)?;
        let shape = cache.shape();
        let mut updated = cache.clone();
        let mut patches = Vec::new();
        for (b, &p) in positions.iter().enumerate() {
            let b = b as i64;
            let one = mlx::ops::slice(&row, &[b, 0, 0], &[b + 1, 1, shape[2]], s)?;
            updated = mlx::ops::slice_update(&updated, &one, &[b, p, 0], &[b + 1, p + 1, shape[2]], s)?;
            patches.push((b as usize, p as usize..p as usize + 1));
        }
        ctx.write_back_rows(0, &updated, 1, patches, 0)?;
        Ok(vec![updated])
    },
};

/// The same with positions as data: `cache[b, pos[b]] = row[b]` built from array ops
/// (compiles), the new rows declared with `write_rows_at`.
static SET_ROW_AT: TestLowering = TestLowering {
    op: "SetRowAt",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, _| {
        let s = ctx.stream();
        let (cache, row, pos) = (ctx.input(0)?.clone(), ctx.input(1)?.clone(), ctx.input(2)?.clone());
        let shape = cache.shape();
        let rows =
            mlx::ops::reshape(&mlx::ops::arange(0.0, shape[1] as f64, 1.0, Dtype::I64, s)?, &[1, shape[1], 1], s)?;
        let at = mlx::ops::equal(&rows, &mlx::ops::reshape(&pos, &[shape[0], 1, 1], s)?, s)?;
        let updated = mlx::ops::where_(&at, &row, &cache, s)?;
        ctx.write_rows_at(0, &row, &pos, 1, 0)?;
        Ok(vec![updated])
    },
};

/// [`SET_ROW_AT`] with its positions checked to lie in the cache (a failed check fails the
/// run).
static SET_ROW_AT_CHECKED: TestLowering = TestLowering {
    op: "SetRowAtChecked",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, node| {
        let s = ctx.stream();
        let (cache, pos) = (ctx.input(0)?.clone(), ctx.input(2)?.clone());
        let len = mlx::ops::scalar(cache.shape()[1] as f64, pos.dtype(), s)?;
        let zero = mlx::ops::scalar(0.0, pos.dtype(), s)?;
        let inside =
            mlx::ops::logical_and(&mlx::ops::greater_equal(&pos, &zero, s)?, &mlx::ops::less(&pos, &len, s)?, s)?;
        ctx.check(&inside, "a position is outside the cache")?;
        (SET_ROW_AT.lower)(ctx, node)
    },
};

/// A shape-keyed reduction over axis 1 (reads the traced shape to drop the axis), which
/// tells the decode slot it absorbs a growing axis 1.
struct SumAxis1;
impl Lowering for SumAxis1 {
    fn op_type(&self) -> &'static str {
        "ReduceSum"
    }
    fn opsets(&self) -> std::ops::RangeInclusive<i32> {
        1..=i32::MAX
    }
    fn claim(&self, _: &NodeInfo) -> std::result::Result<(), Decline> {
        Ok(())
    }
    fn lower(&self, ctx: &mut LowerCtx<'_>, _: &NodeInfo) -> Result<Vec<Array>> {
        Ok(vec![mlx::ops::sum_axes(ctx.input(0)?, &[1], false, ctx.stream())?])
    }
    fn growth(&self, q: &crate::growth::GrowthQuery<'_>) -> crate::growth::GrowthResult {
        crate::growth::reduction(q, &[1], 2)
    }
}
static REDUCE_SUM: SumAxis1 = SumAxis1;

/// A shape-keyed op that reads its input's length into a constant (an arange of it).
static ADD_POSITIONS: TestLowering = TestLowering {
    op: "AddPositions",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, _| {
        let x = ctx.input(0)?;
        let n = x.shape()[1] as f64;
        let pos = mlx::ops::arange(0.0, n, 1.0, Dtype::F32, ctx.stream())?;
        Ok(vec![mlx::ops::add(x, &pos, ctx.stream())?])
    },
};

/// `a + (b or 1)`: input 1 is optional.
static ADD_OPTIONAL: TestLowering = TestLowering {
    op: "AddOptional",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, _| {
        let one = Array::scalar_f32(1.0);
        let b = ctx.optional_input(1).unwrap_or(&one);
        Ok(vec![mlx::ops::add(ctx.input(0)?, b, ctx.stream())?])
    },
};

/// Runs its `body` subgraph attribute and returns the subgraph's outputs.
static RUN_BODY: TestLowering = TestLowering {
    op: "RunBody",
    safety: CompileSafety::ShapeKeyed,
    lower: |ctx, node| {
        let body = node.attr_graph("body").map_err(Error::new)?.expect("test node has a body");
        ctx.run_subgraph(body, vec![])
    },
};

fn value(name: &str) -> Option<ValueInfo> {
    Some(ValueInfo { name: name.into(), elem_type: Some(ElemType::F32), shape: None, is_constant: false })
}

/// `y = (x op1 w) op2 x` over the test lowerings, compiled unless `compile` is false.
fn two_node_plan(op1: &str, op2: &str, compile: bool) -> (Plan, Arc<SessionStats>) {
    let registry = Registry::build(&[&ADD, &MUL, &SUB_KEYED, &DIV_NEVER]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let w = Array::from_slice(&[0.5f32], &[1]).unwrap();
    let plan = make_plan(
        &registry,
        vec![node(op1, ["x", "w"], "t"), node(op2, ["t", "x"], "y")],
        &["x"],
        &["y"],
        vec![("w", w)],
        &stats,
        compile,
    )
    .unwrap();
    (plan, stats)
}

fn ramp(shape: &[i64]) -> (Array, Vec<f32>) {
    let n: i64 = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
    (Array::from_slice(&v, shape).unwrap(), v)
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    SessionStats::count(c)
}

/// A plan over `nodes` whose outputs are float32, built against `registry`.
fn make_plan(
    registry: &Registry,
    nodes: Vec<NodeInfo>,
    inputs: &[&str],
    outputs: &[&str],
    constants: Vec<(&str, Array)>,
    stats: &Arc<SessionStats>,
    compile: bool,
) -> Result<Plan> {
    Plan::new(
        "p",
        nodes,
        inputs.iter().map(|n| n.to_string()).collect(),
        outputs.iter().map(|n| (n.to_string(), ElemType::F32)).collect(),
        constants.into_iter().map(|(n, a)| (n.to_owned(), Arc::new(a))).collect(),
        registry,
        Arc::clone(stats),
        compile,
    )
}

fn node(op: &str, inputs: [&str; 2], output: &str) -> NodeInfo {
    NodeInfo {
        name: format!("{op}_node"),
        op_type: op.into(),
        domain: String::new(),
        since_version: 14,
        inputs: inputs.iter().map(|n| value(n)).collect(),
        outputs: vec![value(output)],
        attributes: Default::default(),
        implicit_inputs: vec![],
    }
}

#[test]
fn a_plan_runs_inputs_constants_and_intermediates() {
    let registry = Registry::build(&[&ADD, &MUL]).unwrap();
    let _g = mlx::lock();
    let w = Array::from_slice(&[10.0f32, 20.0], &[2]).unwrap();
    let plan = make_plan(
        &registry,
        vec![node("Add", ["x", "w"], "t"), node("Mul", ["t", "x"], "y")],
        &["x"],
        &["y", "t"],
        vec![("w", w)],
        &Arc::new(SessionStats::default()),
        false,
    )
    .unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let out = plan.run(vec![x]).unwrap().outputs;
    let s = Stream::cpu().unwrap();
    assert_eq!(out[0].to_vec::<f32>(&s).unwrap(), vec![11.0, 44.0]);
    assert_eq!(out[1].to_vec::<f32>(&s).unwrap(), vec![11.0, 22.0]);
}

#[test]
fn a_value_without_source_is_rejected_naming_the_node() {
    let registry = Registry::build(&[&ADD]).unwrap();
    let err = make_plan(
        &registry,
        vec![node("Add", ["x", "missing"], "y")],
        &["x"],
        &["y"],
        vec![],
        &Arc::new(SessionStats::default()),
        false,
    )
    .err()
    .unwrap();
    assert!(err.0.contains("Add_node") && err.0.contains("missing"), "{err}");
}

#[test]
fn an_op_without_lowering_is_rejected() {
    let registry = Registry::build(&[&ADD]).unwrap();
    let err = make_plan(
        &registry,
        vec![node("Mul", ["x", "x"], "y")],
        &["x"],
        &["y"],
        vec![],
        &Arc::new(SessionStats::default()),
        false,
    )
    .err()
    .unwrap();
    assert!(err.0.contains("no lowering registered for Mul"), "{err}");
}

#[test]
fn mlx_failures_during_a_run_name_the_node() {
    let registry = Registry::build(&[&ADD]).unwrap();
    let _g = mlx::lock();
    let plan = make_plan(
        &registry,
        vec![node("Add", ["x", "z"], "y")],
        &["x", "z"],
        &["y"],
        vec![],
        &Arc::new(SessionStats::default()),
        false,
    )
    .unwrap();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let z = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let err = plan.run(vec![x, z]).err().expect("mismatched shapes fail");
    assert!(err.0.contains("node 'Add_node' (Add)"), "{err}");
}

#[test]
fn a_second_run_of_the_same_shapes_replays_without_tracing() {
    let _g = mlx::lock();
    let (plan, stats) = two_node_plan("Add", "Mul", true);
    assert_eq!(plan.mode(), Mode::Shapeless);
    let s = Stream::cpu().unwrap();
    for _ in 0..3 {
        let (x, v) = ramp(&[2, 3]);
        let y = plan.run(vec![x]).unwrap().outputs;
        let want: Vec<f32> = v.iter().map(|x| (x + 0.5) * x).collect();
        assert_eq!(y[0].to_vec::<f32>(&s).unwrap(), want);
    }
    assert_eq!((count(&stats.traces), count(&stats.compiles), count(&stats.replays)), (1, 1, 2));
    assert_eq!(count(&stats.eager_runs), 0);
}

#[test]
fn a_decode_style_growing_length_never_retraces() {
    let _g = mlx::lock();
    let (plan, stats) = two_node_plan("Add", "Mul", true);
    let s = Stream::cpu().unwrap();
    for len in 2..=9 {
        let (x, v) = ramp(&[1, len, 4]);
        let y = plan.run(vec![x]).unwrap().outputs;
        assert_eq!(y[0].shape(), vec![1, len, 4]);
        let want: Vec<f32> = v.iter().map(|x| (x + 0.5) * x).collect();
        assert_eq!(y[0].to_vec::<f32>(&s).unwrap(), want, "length {len}");
    }
    // The first length is compiled exactly (no broadcasts of its own in the graph), the
    // second traces the shapeless closure that every later length replays.
    assert_eq!(count(&stats.traces), 2, "a shapeless partition traces its first shape and then once more");
    assert_eq!(count(&stats.replays), 6);
    // The first length again replays its exact closure.
    let (x, _) = ramp(&[1, 2, 4]);
    plan.run(vec![x]).unwrap();
    assert_eq!((count(&stats.traces), count(&stats.replays)), (2, 7));
    // A length of 1 is another broadcasting pattern (a size-1 dim), so it gets its own trace.
    let (x, _) = ramp(&[1, 1, 4]);
    assert_eq!(plan.run(vec![x]).unwrap().outputs[0].shape(), vec![1, 1, 4]);
    assert_eq!(count(&stats.traces), 3);
}

#[test]
fn shape_keyed_partitions_trace_per_shape_in_a_bounded_cache() {
    let _g = mlx::lock();
    let (plan, stats) = two_node_plan("Sub", "Mul", true);
    assert_eq!(plan.mode(), Mode::ShapeKeyed);
    let s = Stream::cpu().unwrap();
    let shapes: Vec<Vec<i64>> = (1..=COMPILED_CACHE_CAPACITY as i64 + 2).map(|n| vec![n, 2]).collect();
    for shape in &shapes {
        let (x, v) = ramp(shape);
        let y = plan.run(vec![x]).unwrap().outputs;
        let want: Vec<f32> = v.iter().map(|x| (x - 0.5) * x).collect();
        assert_eq!(y[0].to_vec::<f32>(&s).unwrap(), want);
    }
    assert_eq!(count(&stats.traces), shapes.len() as u64);
    assert_eq!(plan.cache.lock().unwrap().len(), COMPILED_CACHE_CAPACITY);
    // A shape still cached replays; the evicted first shape is traced again.
    plan.run(vec![ramp(&shapes[shapes.len() - 1]).0]).unwrap();
    assert_eq!(count(&stats.traces), shapes.len() as u64);
    plan.run(vec![ramp(&shapes[0]).0]).unwrap();
    assert_eq!(count(&stats.traces), shapes.len() as u64 + 1);
}

#[test]
fn a_lowering_unsafe_to_compile_makes_the_partition_eager_with_a_reason() {
    let _g = mlx::lock();
    let (plan, stats) = two_node_plan("Add", "Div", true);
    match plan.mode() {
        Mode::Eager(reason) => assert!(reason.contains("Div_node"), "{reason}"),
        other => panic!("expected eager, got {other:?}"),
    }
    plan.run(vec![ramp(&[3]).0]).unwrap();
    assert_eq!((count(&stats.traces), count(&stats.eager_runs)), (0, 1));
    assert!(stats.summary().contains("eager fallback: partition p: node 'Div_node' (Div) cannot be compiled"));
}

#[test]
fn compilation_can_be_switched_off() {
    let _g = mlx::lock();
    let (plan, stats) = two_node_plan("Add", "Mul", false);
    assert!(matches!(plan.mode(), Mode::Eager(_)));
    plan.run(vec![ramp(&[2]).0]).unwrap();
    plan.run(vec![ramp(&[2]).0]).unwrap();
    assert_eq!((count(&stats.traces), count(&stats.eager_runs)), (0, 2));
}

#[test]
fn shapeless_replays_broadcast_between_inputs_of_new_shapes() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&ADD]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let plan =
        make_plan(&registry, vec![node("Add", ["a", "b"], "y")], &["a", "b"], &["y"], vec![], &stats, true).unwrap();
    let s = Stream::cpu().unwrap();
    for n in 2..=4i64 {
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|j| 10.0 * j as f32).collect();
        let y = plan
            .run(vec![Array::from_slice(&a, &[n, 1]).unwrap(), Array::from_slice(&b, &[1, n]).unwrap()])
            .unwrap()
            .outputs;
        assert_eq!(y[0].shape(), vec![n, n]);
        let want: Vec<f32> = (0..n).flat_map(|i| (0..n).map(move |j| i as f32 + 10.0 * j as f32)).collect();
        assert_eq!(y[0].to_vec::<f32>(&s).unwrap(), want, "n = {n}");
    }
}

fn trans_b_plan(compile: bool, weight_is_constant: bool) -> (Plan, Arc<SessionStats>) {
    let registry = Registry::build(&[&MATMUL_TRANS_B]).unwrap();
    let stats = Arc::new(SessionStats::default());
    let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let (inputs, constants): (&[&str], _) =
        if weight_is_constant { (&["x"], vec![("w", w)]) } else { (&["x", "w"], vec![]) };
    let mut n = node("MatMulTransB", ["x", "w"], "y");
    n.name = "mm".into();
    let plan = make_plan(&registry, vec![n], inputs, &["y"], constants, &stats, compile).unwrap();
    (plan, stats)
}

#[test]
fn a_constant_transform_runs_once_per_session() {
    let _g = mlx::lock();
    let s = Stream::cpu().unwrap();
    for compile in [false, true] {
        let (plan, stats) = trans_b_plan(compile, true);
        for rows in [1i64, 2, 1] {
            let (x, _) = ramp(&[rows, 3]);
            let y = plan.run(vec![x]).unwrap().outputs;
            // x = [-1, -0.75, -0.5] (and [-0.25, 0, 0.25]); w rows [1, 2, 3], [4, 5, 6].
            let want: Vec<f32> =
                [[-4.0f32, -10.75], [0.5, 0.5]].iter().take(rows as usize).flatten().copied().collect();
            assert_eq!(y[0].to_vec::<f32>(&s).unwrap(), want, "compile {compile}");
        }
        assert_eq!(count(&stats.derived_constants), 1, "compile {compile}: transposed once");
    }
}

#[test]
fn transforms_of_runtime_inputs_are_never_cached() {
    let _g = mlx::lock();
    let (plan, stats) = trans_b_plan(false, false);
    for _ in 0..2 {
        let (x, _) = ramp(&[1, 3]);
        let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        plan.run(vec![x, w]).unwrap();
    }
    assert_eq!(count(&stats.derived_constants), 0);
}

#[test]
fn a_trace_records_phases_and_node_builds() {
    let _g = mlx::lock();
    let path = std::env::temp_dir().join(format!("mlx-ep-trace-test-{}.json", std::process::id()));
    let registry = Registry::build(&[&ADD, &MUL]).unwrap();
    let stats = Arc::new(SessionStats::with_tracer(Some(crate::trace::Tracer::new(path.clone()))));
    let w = Array::from_slice(&[0.5f32], &[1]).unwrap();
    let plan = make_plan(
        &registry,
        vec![node("Add", ["x", "w"], "t"), node("Mul", ["t", "x"], "y")],
        &["x"],
        &["y"],
        vec![("w", w)],
        &stats,
        true,
    )
    .unwrap();
    plan.run(vec![ramp(&[2, 3]).0]).unwrap();
    plan.run(vec![ramp(&[2, 3]).0]).unwrap();
    stats.finish();
    let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let events = trace["traceEvents"].as_array().unwrap();
    let named = |name: &str| events.iter().filter(|e| e["name"] == name).count();
    assert_eq!(named("compile"), 1);
    assert_eq!(named("eval"), 2);
    // Nodes are built once, by the single trace, with their shapes recorded.
    assert_eq!(named("Add_node"), 1);
    let add = events.iter().find(|e| e["name"] == "Add_node").unwrap();
    assert_eq!(add["args"]["op"], "Add");
    assert_eq!(add["args"]["outputs"][0], "F32[2, 3]");
    assert!(events.iter().all(|e| e["ph"] == "X" && e["dur"].as_f64().unwrap() >= 0.0));
}

#[test]
fn an_omitted_optional_input_resolves_to_absent() {
    let _g = mlx::lock();
    let registry = Registry::build(&[&ADD_OPTIONAL]).unwrap();
    let mut n = node("AddOptional", ["x", "unused"], "y");
    n.inputs[1] = None;
    let plan =
        make_plan(&registry, vec![n], &["x"], &["y"], vec![], &Arc::new(SessionStats::default()), false).unwrap();
    assert_eq!(plan.translation.nodes[0].inputs, vec![Source::Input(0), Source::Absent]);
    let y = plan.run(vec![Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap()]).unwrap().outputs;
    assert_eq!(y[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap(), vec![2.0, 3.0]);
}

#[test]
fn subgraph_initializers_are_uploaded_once_per_plan() {
    use crate::graph::{AttrValue, Subgraph, TensorData};
    let _g = mlx::lock();
    let registry = Registry::build(&[&RUN_BODY]).unwrap();
    let bytes: Vec<u8> = [7.0f32, 8.0, 9.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
    let body = Subgraph {
        inputs: vec![],
        outputs: vec![value("c").unwrap()],
        nodes: vec![],
        initializers: vec![("c".into(), TensorData { elem_type: ElemType::F32, shape: vec![3], bytes })],
    };
    let mut n = node("RunBody", ["x", "x"], "y");
    n.inputs.clear();
    n.attributes.insert("body".into(), AttrValue::Graph(Box::new(body)));
    let plan = make_plan(&registry, vec![n], &[], &["y"], vec![], &Arc::new(SessionStats::default()), false).unwrap();
    let cached = || {
        plan.translation
            .caches
            .subgraphs
            .arrays
            .lock()
            .unwrap()
            .values()
            .next()
            .map(|a| a.host_bytes().unwrap().as_ptr() as usize)
    };
    let first = plan.run(vec![]).unwrap().outputs;
    let buffer = cached().expect("the initializer is cached");
    let second = plan.run(vec![]).unwrap().outputs;
    assert_eq!(cached(), Some(buffer), "the same MLX buffer serves every run");
    for y in [first, second] {
        assert_eq!(y[0].to_vec::<f32>(&Stream::cpu().unwrap()).unwrap(), vec![7.0, 8.0, 9.0]);
    }
}
