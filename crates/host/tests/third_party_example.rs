//! The third-party example (`examples/ops-quickgelu`, bundled by `examples/plugin-quickgelu`)
//! extends the EP through ep-core's public API alone: ORT runs its `com.microsoft:QuickGelu`
//! node on the MLX EP, next to the project's own lowerings, and matches the CPU EP.

use mlx_ep_host::models::{Io, domain_node, graph_model_with_opsets, node};
use mlx_ep_host::ort::operator::Attribute;
use mlx_ep_host::ort::value::TensorElementType::Float32;
use mlx_ep_host::values;
use mlx_ep_host::{Ep, MLX_EP, Result, assignment, environment_with_plugin, ep_of, session_builder};
use std::path::PathBuf;

fn example_plugin() -> PathBuf {
    let name = if cfg!(target_os = "macos") { "libmlx_ep_with_quickgelu.dylib" } else { "libmlx_ep_with_quickgelu.so" };
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug").join(name)
}

#[test]
fn an_out_of_tree_op_crate_runs_on_mlx() -> Result<()> {
    let lib = example_plugin();
    assert!(lib.exists(), "{} is not built: `cargo build --workspace` (cargo xtask test does it)", lib.display());
    environment_with_plugin(&lib)?;
    let build = || {
        let x: Io = ("x", Float32, &[4, 6]);
        let y: Io = ("y", Float32, &[4, 6]);
        graph_model_with_opsets(
            &[("", 17), ("com.microsoft", 1)],
            &[x],
            &[y],
            &[],
            vec![
                node("Tanh", "tanh", &["x"], &["t"], vec![])?,
                domain_node(
                    "com.microsoft",
                    "QuickGelu",
                    "quick_gelu",
                    &["t"],
                    &["y"],
                    vec![Attribute::new("alpha", 1.0f32)?],
                )?,
            ],
        )
    };
    let mut cpu = build()?.into_session(&session_builder(Ep::Cpu)?)?;
    let mut mlx = build()?.into_session(&session_builder(Ep::Mlx)?)?;
    let a = assignment(&mlx)?;
    assert_eq!(ep_of(&a, "quick_gelu").as_deref(), Some(MLX_EP), "{a:?}");
    assert_eq!(ep_of(&a, "tanh").as_deref(), Some(MLX_EP), "{a:?}");
    let inputs = values::random_inputs(&cpu, &Default::default(), 3)?;
    let want = values::run(&mut cpu, &inputs)?;
    let got = values::run(&mut mlx, &inputs)?;
    for (g, w) in got[0].values.iter().zip(&want[0].values) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "MLX {g} vs CPU {w}");
    }
    Ok(())
}
