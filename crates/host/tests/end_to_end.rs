//! End to end on the real stack: ONNX Runtime 1.31 (the wheel's library) loads the built
//! plugin; sessions run graphs with claimed and unclaimed nodes; ORT's own assignment info must
//! show which EP ran each node, and outputs must match the CPU EP's.
//!
//! Needs `ORT_MLX_EP_LIB` (the built plugin) and `ORT_DYLIB_PATH` (ONNX Runtime): `cargo xtask
//! test` provides both. Without them these tests fail, never skip.

use mlx_ep_host::models::{self, Io, domain_node, graph_model, graph_model_with_opsets, node};
use mlx_ep_host::ort::editor::Model;
use mlx_ep_host::ort::operator::Attribute;
use mlx_ep_host::ort::value::TensorElementType::{Float16, Float32, Float64};
use mlx_ep_host::values::{self, HostTensor};
use mlx_ep_host::{CPU_EP, Ep, MLX_EP, Result, assignment, ep_of, session_builder};
use std::collections::HashMap;

/// Runs `build()` on the CPU EP and on the MLX EP with the same random inputs.
fn both(
    build: impl Fn() -> Result<Model>,
    dims: &[(&str, i64)],
) -> Result<(Vec<mlx_ep_host::Assignment>, Vec<HostTensor>, Vec<HostTensor>)> {
    let dims: HashMap<String, i64> = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let mut cpu = build()?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut mlx = build()?.into_session(&session_builder(Ep::Mlx)?)?;
    let inputs = values::random_inputs(&cpu, &dims, 11)?;
    let expected = values::run(&mut cpu, &inputs)?;
    let got = values::run(&mut mlx, &inputs)?;
    Ok((assignment(&mlx)?, got, expected))
}

fn assert_close(got: &[HostTensor], expected: &[HostTensor], atol: f64, rtol: f64) {
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        assert_eq!((g.name.as_str(), &g.shape, g.elem_type), (e.name.as_str(), &e.shape, e.elem_type));
        for (i, (&x, &y)) in g.values.iter().zip(&e.values).enumerate() {
            assert!((x - y).abs() <= atol + rtol * y.abs(), "output '{}' element {i}: MLX {x} vs CPU {y}", g.name);
        }
    }
}

fn assert_on(assign: &[mlx_ep_host::Assignment], node: &str, ep: &str) {
    assert_eq!(ep_of(assign, node).as_deref(), Some(ep), "node '{node}' should run on {ep}; assignment: {assign:?}");
}

#[test]
fn claimed_nodes_run_on_mlx_and_the_rest_on_cpu() -> Result<()> {
    // MatMul -> Relu -> ai.onnx.ml LinearRegressor with a SOFTMAX post transform (which the MLX
    // EP declines: it lowers NONE only) -> Softmax -> Tanh
    let build = || {
        let x: Io = ("x", Float32, &[3, 8]);
        let y: Io = ("y", Float32, &[3, 5]);
        let coefficients: Vec<f32> = (0..25).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
        let regressor = vec![
            ort::operator::Attribute::new("coefficients", coefficients)?,
            ort::operator::Attribute::new("targets", 5i64)?,
            ort::operator::Attribute::new("post_transform", "SOFTMAX".to_string())?,
        ];
        graph_model_with_opsets(
            &[("", 17), ("ai.onnx.ml", 1)],
            &[x],
            &[y],
            &[("W", &[8, 5])],
            vec![
                node("MatMul", "mm", &["x", "W"], &["h"], vec![])?,
                node("Relu", "relu", &["h"], &["r"], vec![])?,
                domain_node("ai.onnx.ml", "LinearRegressor", "regress", &["r"], &["c"], regressor)?,
                node("Softmax", "softmax", &["c"], &["s"], vec![])?,
                node("Tanh", "tanh", &["s"], &["y"], vec![])?,
            ],
        )
    };
    let (assign, got, expected) = both(build, &[])?;
    for n in ["mm", "relu", "softmax", "tanh"] {
        assert_on(&assign, n, MLX_EP);
    }
    assert_on(&assign, "regress", CPU_EP);
    let mlx_partitions = assign.iter().filter(|a| a.ep == MLX_EP).count();
    assert_eq!(mlx_partitions, 2, "one partition on each side of the CPU node: {assign:?}");
    assert_close(&got, &expected, 1e-5, 1e-4);
    Ok(())
}

#[test]
fn the_demo_mlp_runs_entirely_on_mlx() -> Result<()> {
    let (assign, got, expected) = both(|| models::mlp(32, 64, 10), &[("batch", 4)])?;
    assert!(!assign.is_empty());
    assert!(assign.iter().all(|a| a.ep == MLX_EP), "{assign:?}");
    // ORT fused MatMul + Add into Gemm before the EP saw the graph.
    assert!(assign.iter().flat_map(|a| &a.nodes).any(|n| n.op_type == "Gemm"), "{assign:?}");
    assert_close(&got, &expected, 1e-5, 1e-4);
    Ok(())
}

#[test]
fn float16_graphs_run_on_mlx() -> Result<()> {
    let build = || {
        let a: Io = ("a", Float16, &[4, 6]);
        let b: Io = ("b", Float16, &[6]);
        let y: Io = ("y", Float16, &[4, 6]);
        graph_model(
            17,
            &[a, b],
            &[y],
            &[],
            vec![
                node("Add", "add", &["a", "b"], &["s"], vec![])?,
                node("Mul", "mul", &["s", "a"], &["m"], vec![])?,
                node("Sub", "sub", &["m", "b"], &["d"], vec![])?,
                node("Sigmoid", "sigmoid", &["d"], &["y"], vec![])?,
            ],
        )
    };
    let (assign, got, expected) = both(build, &[])?;
    for n in ["add", "mul", "sub", "sigmoid"] {
        assert_on(&assign, n, MLX_EP);
    }
    assert_close(&got, &expected, 2e-3, 1e-2);
    Ok(())
}

#[test]
fn unsupported_dtypes_stay_on_cpu_with_correct_results() -> Result<()> {
    let build = || {
        // The transcendental lowerings take float32/16 and bfloat16 only.
        let a: Io = ("a", Float64, &[5]);
        let y: Io = ("y", Float64, &[5]);
        graph_model(17, &[a], &[y], &[], vec![node("Sin", "double_sin", &["a"], &["y"], vec![])?])
    };
    let (assign, got, expected) = both(build, &[])?;
    assert_on(&assign, "double_sin", CPU_EP);
    assert_close(&got, &expected, 0.0, 0.0);
    Ok(())
}

#[test]
fn gemm_attributes_match_cpu() -> Result<()> {
    let build = || {
        let a: Io = ("a", Float32, &[7, 3]);
        let y: Io = ("y", Float32, &[3, 4]);
        let attrs = vec![
            Attribute::new("transA", 1i64)?,
            Attribute::new("transB", 1i64)?,
            Attribute::new("alpha", 0.5f32)?,
            Attribute::new("beta", 2.0f32)?,
        ];
        graph_model(
            11,
            &[a],
            &[y],
            &[("B", &[4, 7]), ("C", &[4])],
            vec![node("Gemm", "gemm", &["a", "B", "C"], &["y"], attrs)?],
        )
    };
    let (assign, got, expected) = both(build, &[])?;
    assert_on(&assign, "gemm", MLX_EP);
    assert_close(&got, &expected, 1e-5, 1e-4);
    Ok(())
}

#[test]
fn opset_11_softmax_normalises_everything_from_axis_on() -> Result<()> {
    let build = || {
        let x: Io = ("x", Float32, &[2, 3, 4]);
        let y: Io = ("y", Float32, &[2, 3, 4]);
        graph_model(
            11,
            &[x],
            &[y],
            &[],
            vec![
                node("Exp", "exp", &["x"], &["e"], vec![])?,
                node("Softmax", "softmax", &["e"], &["y"], vec![Attribute::new("axis", 1i64)?])?,
            ],
        )
    };
    let (assign, got, expected) = both(build, &[])?;
    assert_on(&assign, "softmax", MLX_EP);
    // Each batch row of 12 values sums to one: the flattening semantics, not per-axis.
    let sum: f64 = got[0].values[..12].iter().sum();
    assert!((sum - 1.0).abs() < 1e-5, "row sum {sum}");
    assert_close(&got, &expected, 1e-5, 1e-4);
    Ok(())
}

#[test]
fn one_session_serves_changing_batch_sizes() -> Result<()> {
    // The compiled partition is replayed for new shapes (shapeless: no re-trace needed).
    let mut cpu = models::mlp(16, 32, 5)?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut mlx = models::mlp(16, 32, 5)?.into_session(&session_builder(Ep::Mlx)?)?;
    for batch in [1, 3, 8, 2] {
        let dims = HashMap::from([("batch".to_string(), batch)]);
        let inputs = values::random_inputs(&cpu, &dims, batch as u64)?;
        let expected = values::run(&mut cpu, &inputs)?;
        let got = values::run(&mut mlx, &inputs)?;
        assert_eq!(got[0].shape, vec![batch, 5]);
        assert_close(&got, &expected, 1e-5, 1e-4);
    }
    Ok(())
}

#[test]
fn two_live_sessions_of_one_model_both_compute_correctly() -> Result<()> {
    // The second session's weights are served from the first one's MLX copies (shared by
    // content); both sessions stay correct while alive together and after one is dropped.
    let mut cpu = models::mlp(24, 48, 6)?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut first = models::mlp(24, 48, 6)?.into_session(&session_builder(Ep::Mlx)?)?;
    let mut second = models::mlp(24, 48, 6)?.into_session(&session_builder(Ep::Mlx)?)?;
    let dims = HashMap::from([("batch".to_string(), 3)]);
    let inputs = values::random_inputs(&cpu, &dims, 21)?;
    let expected = values::run(&mut cpu, &inputs)?;
    assert_close(&values::run(&mut first, &inputs)?, &expected, 1e-5, 1e-4);
    assert_close(&values::run(&mut second, &inputs)?, &expected, 1e-5, 1e-4);
    drop(first);
    assert_close(&values::run(&mut second, &inputs)?, &expected, 1e-5, 1e-4);
    Ok(())
}

#[test]
fn a_failing_node_is_an_error_naming_it_and_the_session_survives() -> Result<()> {
    use mlx_ep_host::ort::value::{DynValue, Tensor, TensorElementType::Int64};
    let build = || {
        let past: Io = ("past", Float32, &[1, 4, 2]);
        let update: Io = ("update", Float32, &[1, 1, 2]);
        let idx: Io = ("write_indices", Int64, &[1]);
        let present: Io = ("present", Float32, &[1, 4, 2]);
        graph_model(
            24,
            &[past, update, idx],
            &[present],
            &[],
            vec![node("TensorScatter", "kv_update", &["past", "update", "write_indices"], &["present"], vec![])?],
        )
    };
    let mut mlx = build()?.into_session(&session_builder(Ep::Mlx)?)?;
    assert_on(&assignment(&mlx)?, "kv_update", MLX_EP);
    let feed = |index: i64| -> Result<Vec<(String, DynValue)>> {
        Ok(vec![
            ("past".to_string(), Tensor::from_array((vec![1i64, 4, 2], vec![0.0f32; 8]))?.into_dyn()),
            ("update".to_string(), Tensor::from_array((vec![1i64, 1, 2], vec![1.0f32; 2]))?.into_dyn()),
            ("write_indices".to_string(), Tensor::from_array((vec![1i64], vec![index]))?.into_dyn()),
        ])
    };
    // Row 7 of a 4-row cache: the lowering refuses, ORT reports it, nothing crashes.
    let err = values::run(&mut mlx, &feed(7)?).expect_err("an out-of-range write index must fail").to_string();
    assert!(err.contains("kv_update") && err.contains("exceeds the cache length"), "{err}");
    let ok = values::run(&mut mlx, &feed(2)?)?;
    assert_eq!(ok[0].values, vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn random_generators_draw_anew_each_run_a_seed_fixing_the_sequence() -> Result<()> {
    // A generator next to other nodes: the partition runs eagerly, so each run draws again;
    // a seed fixes the sequence of draws: a second session draws the first one's values.
    let build = |seed: Option<f32>| {
        let x: Io = ("x", Float32, &[64]);
        let y: Io = ("y", Float32, &[64]);
        let mut attrs = vec![Attribute::new("low", 2.0f32)?, Attribute::new("high", 3.0f32)?];
        if let Some(s) = seed {
            attrs.push(Attribute::new("seed", s)?);
        }
        graph_model(
            20,
            &[x],
            &[y],
            &[],
            vec![
                node("RandomUniformLike", "draw", &["x"], &["u"], attrs)?,
                node("Add", "add", &["u", "x"], &["y"], vec![])?,
            ],
        )
    };
    let zeros = vec![("x".to_string(), values::tensor_from_f64(Float32, &[64], &[0.0; 64])?)];
    for seed in [None, Some(7.0)] {
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let mut mlx = build(seed)?.into_session(&session_builder(Ep::Mlx)?)?;
            assert_on(&assignment(&mlx)?, "draw", MLX_EP);
            let runs: Vec<Vec<f64>> =
                (0..3).map(|_| Ok(values::run(&mut mlx, &zeros)?[0].values.clone())).collect::<Result<_>>()?;
            for v in &runs {
                assert!(v.iter().all(|&u| (2.0..3.0).contains(&u)), "{v:?}");
            }
            assert!(runs[0] != runs[1] && runs[1] != runs[2], "seed {seed:?}: {runs:?}");
            sessions.push(runs);
        }
        assert_eq!(sessions[0] == sessions[1], seed.is_some(), "seed {seed:?}: {sessions:?}");
    }
    Ok(())
}
