//! Every registered lowering, differentially checked against the CPU EP on representative
//! shapes (broadcasting, batches, 1-D operands, float32 and float16).

use conformance::{Case, check, no_attributes};
use mlx_ep_host::Result;
use mlx_ep_host::ort::operator::Attribute;
use mlx_ep_host::ort::value::TensorElementType::{self, Float16 as F16, Float32 as F32, Int64 as I64};

fn unary(op: &'static str, opset: u32, t: TensorElementType, shape: &[i64]) -> Case {
    Case {
        op,
        opset,
        inputs: vec![("x", t, shape.to_vec())],
        outputs: vec![("y", t, shape.to_vec())],
        attributes: no_attributes,
    }
}

fn binary(op: &'static str, t: TensorElementType, a: &[i64], b: &[i64], y: &[i64]) -> Case {
    Case {
        op,
        opset: 14,
        inputs: vec![("a", t, a.to_vec()), ("b", t, b.to_vec())],
        outputs: vec![("y", t, y.to_vec())],
        attributes: no_attributes,
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for op in ["Add", "Sub", "Mul", "Div"] {
        v.push(binary(op, F32, &[2, 3, 4], &[4], &[2, 3, 4]));
        v.push(binary(op, F32, &[], &[3], &[3]));
        v.push(binary(op, F16, &[3, 1], &[1, 5], &[3, 5]));
    }
    for op in ["Relu", "Sigmoid", "Tanh", "Exp"] {
        v.push(unary(op, 14, F32, &[2, 5]));
        v.push(unary(op, 14, F16, &[7]));
        v.push(unary(op, 6, F32, &[0, 3]));
    }
    // Inputs are in [-1, 1): outside an op's domain (Log, Sqrt, Acosh of negatives) both EPs
    // give NaN, which compares equal.
    for op in [
        "Log",
        "Sqrt",
        "Abs",
        "Neg",
        "Reciprocal",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Erf",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
    ] {
        v.push(unary(op, 13, F32, &[3, 4]));
        v.push(unary(op, 13, F16, &[5]));
    }
    v.push(binary("MatMul", F32, &[2, 3, 4], &[4, 5], &[2, 3, 5]));
    v.push(binary("MatMul", F32, &[4], &[4, 3], &[3]));
    v.push(binary("MatMul", F16, &[3, 8], &[8, 2], &[3, 2]));
    v.push(Case {
        op: "Gemm",
        opset: 13,
        inputs: vec![("a", F32, vec![3, 6]), ("b", F32, vec![4, 6]), ("c", F32, vec![1, 4])],
        outputs: vec![("y", F32, vec![3, 4])],
        attributes: || Ok(vec![Attribute::new("transB", 1i64)?, Attribute::new("beta", 0.5f32)?]),
    });
    v.push(Case {
        op: "Gemm",
        opset: 9,
        inputs: vec![("a", F16, vec![5, 2]), ("b", F16, vec![5, 3]), ("c", F16, vec![3])],
        outputs: vec![("y", F16, vec![2, 3])],
        attributes: || Ok(vec![Attribute::new("transA", 1i64)?, Attribute::new("alpha", 2.0f32)?]),
    });
    v.push(Case {
        op: "Softmax",
        opset: 13,
        inputs: vec![("x", F32, vec![2, 3, 4])],
        outputs: vec![("y", F32, vec![2, 3, 4])],
        attributes: || Ok(vec![Attribute::new("axis", -2i64)?]),
    });
    v.push(unary("Softmax", 13, F16, &[3, 6]));
    v.push(unary("Softmax", 11, F32, &[2, 3, 4]));
    // Write indices are random in [0, 4): every case below keeps them inside the cache.
    v.push(Case {
        op: "TensorScatter",
        opset: 24,
        inputs: vec![("past", F32, vec![2, 6, 3]), ("update", F32, vec![2, 1, 3]), ("write_indices", I64, vec![2])],
        outputs: vec![("present", F32, vec![2, 6, 3])],
        attributes: no_attributes,
    });
    v.push(Case {
        op: "TensorScatter",
        opset: 24,
        inputs: vec![
            ("past", F16, vec![1, 2, 5, 4]),
            ("update", F16, vec![1, 2, 2, 4]),
            ("write_indices", I64, vec![1]),
        ],
        outputs: vec![("present", F16, vec![1, 2, 5, 4])],
        attributes: || Ok(vec![Attribute::new("axis", -2i64)?]),
    });
    v.push(Case {
        op: "TensorScatter",
        opset: 24,
        inputs: vec![("past", F32, vec![3, 4, 2]), ("update", F32, vec![3, 4, 2])],
        outputs: vec![("present", F32, vec![3, 4, 2])],
        attributes: || Ok(vec![Attribute::new("axis", 1i64)?, Attribute::new("mode", "linear".to_string())?]),
    });
    v
}

#[test]
fn every_case_runs_on_mlx_and_matches_cpu() -> Result<()> {
    let mut failures = Vec::new();
    let cases = cases();
    for (i, case) in cases.iter().enumerate() {
        if let Err(e) = check(case, 1000 + i as u64) {
            failures.push(e.to_string());
        }
    }
    println!("{} passed, {} failed", cases.len() - failures.len(), failures.len());
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
    Ok(())
}

/// Ops with subgraph attributes, which ORT's model editor cannot build: `python/check_plugin.py`
/// checks them (building the models with `onnx.helper`), and this list is verified against it.
const CHECKED_IN_PYTHON: &[&str] = &["If"];

#[test]
fn every_registered_op_has_a_case() {
    let listed = include_str!("../../plugin/registered-ops.txt");
    let python = include_str!("../../../python/check_plugin.py");
    let cases = cases();
    for line in listed.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (op, range) = line.split_once(' ').expect("`op range` lines");
        let (lo, hi) = match range.strip_suffix('+') {
            Some(lo) => (lo.parse::<u32>().unwrap(), u32::MAX),
            None => {
                let (a, b) = range.split_once('-').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            }
        };
        if CHECKED_IN_PYTHON.contains(&op) {
            assert!(python.contains(&format!("make_node(\"{op}\"")), "`{op}` is not checked in python/check_plugin.py");
            continue;
        }
        assert!(
            cases.iter().any(|c| c.op == op && (lo..=hi).contains(&c.opset)),
            "registered lowering `{line}` has no conformance case"
        );
    }
}
