//! A plugin built without the `nn` family (`cargo xtask test` builds it into
//! `target/debug/trimmed/`): the nn family's nodes stay on the CPU EP while the elementwise
//! nodes still run on MLX.

use mlx_ep_host::models::{Io, graph_model, node};
use mlx_ep_host::ort::value::TensorElementType::Float32;
use mlx_ep_host::values;
use mlx_ep_host::{CPU_EP, Ep, MLX_EP, Result, assignment, environment_with_plugin, ep_of, session_builder};
use std::path::PathBuf;

#[test]
fn a_trimmed_plugin_leaves_the_missing_family_on_cpu() -> Result<()> {
    let name = if cfg!(target_os = "macos") { "libonnxruntime_mlx_ep.dylib" } else { "libonnxruntime_mlx_ep.so" };
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/trimmed").join(name);
    assert!(
        lib.exists(),
        "{} is not built: cargo xtask test builds it (--no-default-features --features elementwise)",
        lib.display()
    );
    environment_with_plugin(&lib)?;
    let build = || {
        let x: Io = ("x", Float32, &[3, 4]);
        let y: Io = ("y", Float32, &[3, 2]);
        graph_model(
            17,
            &[x],
            &[y],
            &[("W", &[4, 2])],
            vec![
                node("Relu", "relu", &["x"], &["r"], vec![])?,
                node("MatMul", "matmul", &["r", "W"], &["m"], vec![])?,
                node("Sigmoid", "sigmoid", &["m"], &["y"], vec![])?,
            ],
        )
    };
    let mut mlx = build()?.into_session(&session_builder(Ep::Mlx)?)?;
    let mut cpu = build()?.into_session(&session_builder(Ep::Cpu)?)?;
    let a = assignment(&mlx)?;
    assert_eq!(ep_of(&a, "relu").as_deref(), Some(MLX_EP), "{a:?}");
    assert_eq!(ep_of(&a, "sigmoid").as_deref(), Some(MLX_EP), "{a:?}");
    assert_eq!(ep_of(&a, "matmul").as_deref(), Some(CPU_EP), "MatMul belongs to the nn family: {a:?}");
    let inputs = values::random_inputs(&cpu, &Default::default(), 5)?;
    let want = values::run(&mut cpu, &inputs)?;
    let got = values::run(&mut mlx, &inputs)?;
    for (g, w) in got[0].values.iter().zip(&want[0].values) {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "MLX {g} vs CPU {w}");
    }
    Ok(())
}
