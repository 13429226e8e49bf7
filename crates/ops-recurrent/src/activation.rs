//! The activation functions ONNX's recurrent ops name in `activations`, with the
//! `activation_alpha` / `activation_beta` values they take, parsed into ep-core's shared
//! [`Activation`].

pub(crate) use ep_core::activation::Activation;

/// The names ONNX defines, as spelled in its operator docs.
const NAMES: &[&str] = &[
    "Relu",
    "Tanh",
    "Sigmoid",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
];

/// Whether activation `name` (lower case) takes an alpha and a beta, and the defaults ONNX's
/// operators of the same name have (`None` where ONNX has none to agree on: ORT's CPU EP reads
/// 0 there, while ONNX's ThresholdedRelu defaults to 1, so such a node is left to it).
fn parameters(name: &str) -> (Option<Option<f64>>, Option<Option<f64>>) {
    match name {
        "affine" | "scaledtanh" => (Some(None), Some(None)),
        "leakyrelu" => (Some(Some(0.01)), None),
        "thresholdedrelu" => (Some(None), None),
        "hardsigmoid" => (Some(Some(0.2)), Some(Some(0.5))),
        "elu" => (Some(Some(1.0)), None),
        _ => (None, None),
    }
}

/// Whether activation `name` takes an alpha and a beta.
pub(crate) fn takes(name: &str) -> (bool, bool) {
    let (a, b) = parameters(&name.to_ascii_lowercase());
    (a.is_some(), b.is_some())
}

/// The known name `name` stands for: matched exactly when `exact`, else without regard to case.
pub(crate) fn canonical(name: &str, exact: bool) -> std::result::Result<&'static str, String> {
    NAMES
        .iter()
        .find(|n| if exact { **n == name } else { n.eq_ignore_ascii_case(name) })
        .copied()
        .ok_or_else(|| format!("activation '{name}' is not one of {NAMES:?}"))
}

/// Activation `name` with the given parameters (`None`: its default; no default: an error).
pub(crate) fn make(name: &str, alpha: Option<f64>, beta: Option<f64>) -> std::result::Result<Activation, String> {
    let lower = name.to_ascii_lowercase();
    let (takes_a, takes_b) = parameters(&lower);
    let pick = |takes: Option<Option<f64>>, given: Option<f64>, what: &str| match (takes, given) {
        (None, _) => Ok(0.0),
        (Some(_), Some(v)) => Ok(v),
        (Some(Some(default)), None) => Ok(default),
        (Some(None), None) => Err(format!("activation '{name}' needs an {what} that activation_{what} does not give")),
    };
    let (a, b) = (pick(takes_a, alpha, "alpha")?, pick(takes_b, beta, "beta")?);
    Ok(match lower.as_str() {
        "relu" => Activation::Relu,
        "tanh" => Activation::Tanh,
        "sigmoid" => Activation::Sigmoid,
        "softsign" => Activation::Softsign,
        "softplus" => Activation::Softplus,
        "affine" => Activation::Affine(a, b),
        "leakyrelu" => Activation::LeakyRelu(a),
        "thresholdedrelu" => Activation::ThresholdedRelu(a),
        "scaledtanh" => Activation::ScaledTanh(a, b),
        "hardsigmoid" => Activation::HardSigmoid(a, b),
        "elu" => Activation::Elu(a),
        _ => return Err(format!("activation '{name}' is not one of {NAMES:?}")),
    })
}

/// The activations `names` (any case), each taking the next value of `alphas` and of `betas`
/// when it has such a parameter, as ONNX's GRU and LSTM consume them.
pub(crate) fn in_order(
    names: &[String],
    alphas: &[f32],
    betas: &[f32],
) -> std::result::Result<Vec<Activation>, String> {
    let (mut alphas, mut betas) = (alphas.iter(), betas.iter());
    names
        .iter()
        .map(|name| {
            let name = canonical(name, false)?;
            let (takes_a, takes_b) = takes(name);
            let a = if takes_a { alphas.next().map(|&v| f64::from(v)) } else { None };
            let b = if takes_b { betas.next().map(|&v| f64::from(v)) } else { None };
            make(name, a, b)
        })
        .collect()
}
