//! `com.microsoft` MatMulBnb4: `A @ W^T` with `W` `[N, K]` stored as 4-bit codes (the
//! bitsandbytes FP4 or NF4 value tables), two per byte (the even element in the high nibble),
//! each block of `block_size` elements scaled by its `absmax`. The weight is dequantized once
//! per session when B and absmax are constants (each value one float32 product, as ORT's
//! kernel computes it), then multiplied in float32. float32 only, `transB` 1 (ORT's kernel
//! reads past its buffer for `transB` 0, which stays on the CPU).

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// The FP4 codes' values.
const FP4: [f32; 16] = [
    0.0,
    5.208_333_3e-3,
    0.666_666_7,
    1.0,
    0.333_333_33,
    0.5,
    0.166_666_67,
    0.25,
    -0.0,
    -5.208_333_3e-3,
    -0.666_666_7,
    -1.0,
    -0.333_333_33,
    -0.5,
    -0.166_666_67,
    -0.25,
];

/// The NF4 codes' values (normal-float quantiles).
const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

struct Layout {
    k: i64,
    n: i64,
    block: i64,
    nf4: bool,
}

fn layout(node: &NodeInfo) -> std::result::Result<Layout, String> {
    let get = |name: &str| -> std::result::Result<i64, String> {
        match node.attr(name) {
            Some(_) => Ok(node.attr_int(name, 0)?),
            None => Err(format!("attribute {name} is required")),
        }
    };
    let (k, n, block, quant) = (get("K")?, get("N")?, get("block_size")?, get("quant_type")?);
    if k < 1 || n < 1 || !matches!(block, 16 | 32 | 64 | 128 | 256) || !(0..=1).contains(&quant) {
        return Err(format!(
            "K {k}, N {n}, block_size {block} (16 to 256, a power of two), quant_type {quant} (0 or 1)"
        ));
    }
    Ok(Layout { k, n, block, nf4: quant == 1 })
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 3, 3)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::U8])?;
    require_input_type(node, 2, &[ElemType::F32])?;
    layout(node).map_err(Decline)?;
    if node.attr_int("transB", 1)? != 1 {
        return Err(Decline::new("transB other than 1 is left to the CPU EP"));
    }
    Ok(())
}

/// The `[N, K]` float32 weight.
fn dequantize(b: &Array, absmax: &Array, l: &Layout, s: &Stream) -> Result<Array> {
    let count = l.n * l.k;
    let bytes = ops::astype(&ops::reshape(b, &[-1], s)?, Dtype::U8, s)?;
    let nb = bytes.size() as i64;
    let u = |v: u8| Array::from_slice(&[v], &[]);
    let high = ops::right_shift(&bytes, &u(4)?, s)?;
    let low = ops::bitwise_and(&bytes, &u(15)?, s)?;
    // [bytes, 2] flattened: element 2i the high nibble, 2i + 1 the low one.
    let codes = ops::reshape(&ops::stack(&[high, low], 1, s)?, &[2 * nb], s)?;
    let codes = ops::slice(&codes, &[0], &[count], s)?;
    let table = Array::from_slice(if l.nf4 { &NF4 } else { &FP4 }, &[16])?;
    let values = ops::take(&table, &ops::astype(&codes, Dtype::I32, s)?, 0, s)?;
    let blocks = (count + l.block - 1) / l.block;
    let scale = ops::slice(&ops::reshape(absmax, &[-1], s)?, &[0], &[blocks], s)?;
    let scale =
        ops::reshape(&ops::broadcast_to(&ops::reshape(&scale, &[blocks, 1], s)?, &[blocks, l.block], s)?, &[-1], s)?;
    let scale = ops::slice(&scale, &[0], &[count], s)?;
    Ok(ops::reshape(&ops::multiply(&values, &scale, s)?, &[l.n, l.k], s)?)
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let s = ctx.stream();
    let l = layout(node)?;
    let (a, b, absmax) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let blocks = (l.n * l.k + l.block - 1) / l.block;
    if (absmax.size() as i64) < blocks {
        bail!("absmax holds {} values, fewer than the {blocks} blocks of {} x {}", absmax.size(), l.n, l.k);
    }
    if (b.size() as i64) < (l.n * l.k + 1) / 2 {
        bail!("B holds {} bytes, fewer than the {} of {} x {} 4-bit codes", b.size(), (l.n * l.k + 1) / 2, l.n, l.k);
    }
    if a.ndim() == 0 || *a.shape().last().expect("rank checked") != l.k {
        bail!("A of shape {:?} does not end in K = {}", a.shape(), l.k);
    }
    let w =
        ctx.derived_many(&[1, 2], "bnb4-weight", |args, s| Ok(vec![dequantize(args[0], args[1], &l, s)?]))?.remove(0);
    let wt = ops::transpose_axes(&w, &[1, 0], s)?;
    Ok(vec![ops::matmul(a, &wt, s)?])
}

ep_core::register_lowering!(
    MATMUL_BNB4 = FnLowering {
        domain: "com.microsoft",
        op: "MatMulBnb4",
        opsets: 1..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::MATMUL_BNB4, || {
        let block = prop_oneof![Just(16i64), Just(32), Just(64), Just(128), Just(256)];
        (0..3usize, 1..=3i64, 1..=40i64, 1..=6i64, block, any::<bool>(), seed())
            .prop_map(|(lead, m, k, n, block, nf4, seed)| {
                let a: Vec<i64> = [vec![2; lead.saturating_sub(1)], vec![m], vec![k]].concat();
                let a = if lead == 0 { vec![k] } else { a };
                let mut y = a.clone();
                *y.last_mut().expect("rank 1 or more") = n;
                let count = n * k;
                Case::domain_op("com.microsoft", "MatMulBnb4", 1)
                    .input("a", DType::F32, &a)
                    .constant("b", DType::U8, &[(count + 1) / 2], Values::Uniform { lo: 0.0, hi: 256.0 })
                    .constant(
                        "absmax",
                        DType::F32,
                        &[(count + block - 1) / block],
                        Values::Uniform { lo: 0.1, hi: 2.0 },
                    )
                    .attr_int("K", k)
                    .attr_int("N", n)
                    .attr_int("block_size", block)
                    .attr_int("quant_type", nf4 as i64)
                    .output("y", DType::F32, &y)
                    .with_seed(seed)
            })
            .boxed()
    });
}
