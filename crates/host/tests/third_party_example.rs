//! The third-party example (`examples/ops-expand-dims`, bundled by `examples/plugin-expand-dims`)
//! extends the EP through ep-core's public API alone: ORT runs its `com.microsoft:ExpandDims`
//! node on the MLX EP, next to the project's own lowerings, and matches the CPU EP.

use mlx_ep_host::models::{domain_node, node, tensor_type};
use mlx_ep_host::ort::editor::{Graph, Model, Opset};
use mlx_ep_host::ort::memory::Allocator;
use mlx_ep_host::ort::value::TensorElementType::Float32;
use mlx_ep_host::ort::value::{Outlet, Tensor};
use mlx_ep_host::values;
use mlx_ep_host::{Ep, MLX_EP, Result, assignment, environment_with_plugin, ep_of, session_builder};
use std::path::PathBuf;

fn example_plugin() -> PathBuf {
    let name =
        if cfg!(target_os = "macos") { "libmlx_ep_with_expand_dims.dylib" } else { "libmlx_ep_with_expand_dims.so" };
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug").join(name)
}

#[test]
fn an_out_of_tree_op_crate_runs_on_mlx() -> Result<()> {
    let lib = example_plugin();
    assert!(lib.exists(), "{} is not built: `cargo build --workspace` (cargo xtask test does it)", lib.display());
    environment_with_plugin(&lib)?;
    let build = || -> Result<Model> {
        let mut graph = Graph::new()?;
        graph.set_inputs([Outlet::new("x", tensor_type(Float32, &[4, 6]))])?;
        graph.set_outputs([Outlet::new("y", tensor_type(Float32, &[4, 1, 6]))])?;
        // The axis is a constant int32 scalar: -2 inserts the new dim before the last one.
        let mut axis = Tensor::<i32>::new(&Allocator::default(), Vec::<i64>::new())?;
        axis.extract_tensor_mut().1[0] = -2;
        graph.add_initializer("axis", axis, false)?;
        graph.add_node(node("Tanh", "tanh", &["x"], &["t"], vec![])?)?;
        graph.add_node(domain_node("com.microsoft", "ExpandDims", "expand_dims", &["t", "axis"], &["y"], vec![])?)?;
        let mut model = Model::new([Opset::new("", 17)?, Opset::new("com.microsoft", 1)?])?;
        model.set_graph(graph)?;
        Ok(model)
    };
    let mut cpu = build()?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut mlx = build()?.into_session(&session_builder(Ep::Mlx)?)?;
    let a = assignment(&mlx)?;
    assert_eq!(ep_of(&a, "expand_dims").as_deref(), Some(MLX_EP), "{a:?}");
    assert_eq!(ep_of(&a, "tanh").as_deref(), Some(MLX_EP), "{a:?}");
    let inputs = values::random_inputs(&cpu, &Default::default(), 3)?;
    let want = values::run(&mut cpu, &inputs)?;
    let got = values::run(&mut mlx, &inputs)?;
    assert_eq!(got[0].shape, vec![4, 1, 6]);
    assert_eq!(got[0].shape, want[0].shape);
    for (g, w) in got[0].values.iter().zip(&want[0].values) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "MLX {g} vs CPU {w}");
    }
    Ok(())
}
