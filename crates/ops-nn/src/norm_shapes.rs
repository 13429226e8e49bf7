//! The shape rules of the normalizations, as ORT's CPU EP enforces them: a claim checks the
//! declared shapes (and declines what breaks a rule, so the CPU EP refuses it), a lowering
//! checks the runtime shapes (and fails the run with the reason). Broadcasting a parameter of
//! another shape would answer what the CPU EP refuses.

use ep_core::lowering::normalize_axis;
use ep_core::{Decline, NodeInfo};

/// A shape as far as it is known: declared (`None` for a symbolic dimension) or at run time.
pub type Dims = Vec<Option<i64>>;

/// The declared shape of input `i`; `None` when it is absent or of unknown rank.
pub fn declared(node: &NodeInfo, i: usize) -> Option<Dims> {
    node.input(i).and_then(|v| v.shape.clone())
}

/// A runtime shape.
pub fn known(shape: &[i64]) -> Dims {
    shape.iter().map(|&d| Some(d)).collect()
}

fn show(d: &Dims) -> String {
    let dims: Vec<String> = d.iter().map(|d| d.map_or("?".to_string(), |d| d.to_string())).collect();
    format!("[{}]", dims.join(", "))
}

/// LayerNormalization, RMSNormalization and SimplifiedLayerNormalization: `x` of rank 1 or
/// more, `x.shape[axis:]` not empty, and each parameter NumPy-broadcastable to `x` without
/// growing it (rank at most `x`'s, each dimension `x`'s or 1, aligned from the end).
pub fn check_layer_norm(x: &Dims, axis: i64, params: &[(&str, Option<Dims>)]) -> Result<(), String> {
    if x.is_empty() {
        return Err("the input is a scalar: it has no axis to normalize".into());
    }
    let a = normalize_axis(axis, x.len())?;
    if x[a..].contains(&Some(0)) {
        return Err(format!("the input {} has no elements to normalize from axis {axis}", show(x)));
    }
    for (name, p) in params {
        let Some(p) = p else { continue };
        let fits = p.len() <= x.len()
            && p.iter().rev().zip(x.iter().rev()).all(|(pd, xd)| match (pd, xd) {
                (Some(pd), Some(xd)) => pd == xd || *pd == 1,
                _ => true,
            });
        if !fits {
            return Err(format!("{name} {} does not broadcast to the input {} (axis {axis})", show(p), show(x)));
        }
    }
    Ok(())
}

/// SkipLayerNormalization and SkipSimplifiedLayerNormalization (ORT's kernels): the input of
/// rank 2 or 3 with a hidden size above 0; the skip of rank 2 or 3 ending in the input's last
/// two dimensions (the input's own shape for a 2-D input; a batch other than 0 otherwise);
/// `vectors` (gamma, beta, bias) 1-D of the hidden size.
pub fn check_skip_norm(x: &Dims, skip: Option<&Dims>, vectors: &[(&str, Option<Dims>)]) -> Result<(), String> {
    if !(2..=3).contains(&x.len()) {
        return Err(format!("the input {} must have rank 2 or 3", show(x)));
    }
    let hidden = x[x.len() - 1];
    if hidden == Some(0) {
        return Err("the hidden size (the input's last dimension) is 0".into());
    }
    let same = |a: Option<i64>, b: Option<i64>| a.is_none() || b.is_none() || a == b;
    if let Some(sk) = skip {
        let tail_ok = (2..=3).contains(&sk.len())
            && same(sk[sk.len() - 1], x[x.len() - 1])
            && same(sk[sk.len() - 2], x[x.len() - 2]);
        let batch_ok = match (x.len(), sk.len()) {
            (2, 2) | (3, 2) => true,
            // ORT's kernel reads the skip's batches cyclically (see `norm::skip_input`).
            (3, 3) => sk[0] != Some(0) || x[0] == Some(0),
            _ => false,
        };
        if !tail_ok || !batch_ok {
            return Err(format!("the skip {} does not fit the input {}", show(sk), show(x)));
        }
    }
    for (name, v) in vectors {
        let Some(v) = v else { continue };
        if v.len() != 1 || !same(v[0], hidden) {
            return Err(format!("{name} {} must be 1-D of the hidden size of the input {}", show(v), show(x)));
        }
    }
    Ok(())
}

/// GroupNormalization: an input without empty dimensions, `groups` dividing its channels, and
/// scale and bias 1-D of the channels (opset 21) or of the groups (opset 18).
pub fn check_group_norm(
    x: &Dims,
    groups: i64,
    per_channel: bool,
    params: &[(&str, Option<Dims>)],
) -> Result<(), String> {
    if x.len() < 2 || x.contains(&Some(0)) {
        return Err(format!("the input {} must have channels and no empty dimension", show(x)));
    }
    if groups < 1 || x[1].is_some_and(|c| c % groups != 0) {
        return Err(format!("num_groups {groups} does not divide the channels of the input {}", show(x)));
    }
    let want = if per_channel { x[1] } else { Some(groups) };
    for (name, p) in params {
        let Some(p) = p else { continue };
        if p.len() != 1 || want.is_some_and(|w| p[0].is_some_and(|d| d != w)) {
            let what = if per_channel { "channels" } else { "groups" };
            return Err(format!("{name} {} must be 1-D of the {what} of the input {}", show(p), show(x)));
        }
    }
    Ok(())
}

/// A claim's answer to a shape check on declared shapes.
pub fn claim(r: Result<(), String>) -> Result<(), Decline> {
    r.map_err(Decline)
}
