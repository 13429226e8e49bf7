//! The property suite in `cargo test`: every registered lowering has a spec, and a bounded
//! number of generated cases per spec (`MLX_EP_CONFORMANCE_CASES`, default 12) runs on the MLX
//! EP and matches the CPU EP. `cargo xtask conformance --cases N` runs deeper.

use conformance::suite::{self, CHECKED_IN_PYTHON, Options};

fn link() {
    conformance::link_op_crates();
}

#[test]
fn every_spec_passes_on_generated_cases() {
    link();
    let cases = std::env::var("MLX_EP_CONFORMANCE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let report = suite::run(&Options { cases, ..Options::default() });
    print!("{}", report.table());
    assert!(report.ok(), "the property suite failed: see the table above");
    assert!(report.rows.iter().map(|r| r.passed).sum::<u32>() > 0, "no case ran");
}

#[test]
fn ops_checked_in_python_are_there() {
    let python = [
        include_str!("../../../python/check_plugin.py"),
        include_str!("../../../python/check_control_flow.py"),
        include_str!("../../../python/check_tree_ensemble.py"),
        include_str!("../../../python/check_sparse_attention.py"),
    ];
    for op in CHECKED_IN_PYTHON {
        assert!(
            python.iter().any(|p| p.contains(&format!("make_node(\"{op}\""))),
            "`{op}` is not checked in python/check_plugin.py, check_control_flow.py, check_tree_ensemble.py or \
             check_sparse_attention.py"
        );
    }
}

#[test]
fn every_registered_lowering_has_a_spec() {
    link();
    let registered = suite::registered_ops();
    assert!(registered.contains(&(String::new(), "Relu".to_owned())), "the op crates' lowerings are linked");
    let report = suite::run(&Options { cases: 0, failures_dir: None, ..Options::default() });
    assert!(report.missing_specs.is_empty(), "lowerings without a spec: {:?}", report.missing_specs);
    assert!(report.orphan_specs.is_empty(), "specs without a lowering: {:?}", report.orphan_specs);
}
