//! The registry of the full plugin holds exactly the lowerings in `registered-ops.txt`.
#![cfg(all(
    feature = "elementwise",
    feature = "tensor",
    feature = "nn",
    feature = "attention",
    feature = "quant",
    feature = "controlflow"
))]

fn describe((domain, op, opsets): &(String, String, std::ops::RangeInclusive<i32>)) -> String {
    let name = if domain.is_empty() { op.clone() } else { format!("{domain}:{op}") };
    let range = if *opsets.end() == i32::MAX {
        format!("{}+", opsets.start())
    } else {
        format!("{}-{}", opsets.start(), opsets.end())
    };
    format!("{name} {range}")
}

#[test]
fn registered_lowerings_match_the_committed_list() {
    let _ = onnxruntime_mlx_ep::families();
    let registry = ep_core::registry::global().expect("registry builds without duplicates");
    let mut actual: Vec<String> = registry.entries().iter().map(describe).collect();
    actual.sort();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/registered-ops.txt");
    if std::env::var_os("UPDATE_REGISTERED_OPS").is_some() {
        let header: String = include_str!("../registered-ops.txt")
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(path, header + &actual.join("\n") + "\n").expect("write registered-ops.txt");
        return;
    }
    let mut expected: Vec<String> = include_str!("../registered-ops.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    expected.sort();
    assert_eq!(
        actual, expected,
        "update crates/plugin/registered-ops.txt when adding or removing a lowering (UPDATE_REGISTERED_OPS=1 cargo test -p onnxruntime-mlx-ep rewrites it)"
    );
}
