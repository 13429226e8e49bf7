//! GridSample (opset 16 on): `X` `[N, C, H, W]` sampled at the normalized points of `grid`
//! `[N, Ho, Wo, 2]` (x along W, y along H) by nearest, bilinear or bicubic interpolation, and
//! `[N, C, D, H, W]` at `[N, Do, Ho, Wo, 3]` by nearest or trilinear (ORT's CPU EP has no
//! volumetric cubic), with zeros, border or reflection padding and both `align_corners` forms, as
//! ORT's CPU EP computes them: the padding applies to each pixel read (a zero outside, the
//! index clamped, or the index reflected by the bounds `align_corners` sets), the weights come
//! from the unpadded coordinates. The samples are gathers from the flattened image, the
//! weights elementwise. `com.microsoft` GridSample, ORT's earlier form, is the 2-D case.

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::{Array, Dtype, Stream, ops};
use ep_core::{AttrValue, CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

fn string_attr<'a>(node: &'a NodeInfo, name: &str, default: &'a str) -> std::result::Result<&'a str, String> {
    match node.attr(name) {
        None => Ok(default),
        Some(AttrValue::String(v)) => Ok(v.as_str()),
        Some(other) => Err(format!("attribute '{name}' should be a string, found {other:?}")),
    }
}

/// The node's mode (opset 16's names and opset 20's), padding and `align_corners`.
fn attributes(node: &NodeInfo) -> std::result::Result<(Mode, Padding, bool), String> {
    let mode = match string_attr(node, "mode", if node.since_version >= 20 { "linear" } else { "bilinear" })? {
        "nearest" => Mode::Nearest,
        "bilinear" | "linear" => Mode::Linear,
        "bicubic" | "cubic" => Mode::Cubic,
        other => return Err(format!("mode '{other}' is not nearest, linear or cubic")),
    };
    let padding = match string_attr(node, "padding_mode", "zeros")? {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return Err(format!("padding_mode '{other}' is not zeros, border or reflection")),
    };
    let align = match node.attr_int("align_corners", 0)? {
        0 => false,
        1 => true,
        v => return Err(format!("align_corners={v} is not 0 or 1")),
    };
    Ok((mode, padding, align))
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::F32])?;
    let (mode, ..) = attributes(node).map_err(Decline)?;
    match node.input(0).and_then(|v| v.rank()) {
        Some(4) | None => Ok(()),
        Some(5) if mode != Mode::Cubic => Ok(()),
        Some(5) => Err(Decline::new("cubic sampling of three spatial axes (ORT's CPU EP refuses it too)")),
        Some(r) => Err(Decline(format!("X has rank {r}; the MLX EP samples two or three spatial axes"))),
    }
}

/// One spatial axis: its length and the bounds coordinates are judged and reflected by.
struct Axis {
    len: i64,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn new(len: i64, align: bool) -> Axis {
        if align { Axis { len, lo: 0.0, hi: (len - 1) as f64 } } else { Axis { len, lo: -0.5, hi: len as f64 - 0.5 } }
    }
}

/// What every sampling step computes with.
struct Sampler<'a> {
    s: &'a Stream,
    padding: Padding,
    /// `X` as `[N, C, D * H * W]` (or `H * W`).
    image: Array,
    /// The spatial axes, outermost first.
    axes: Vec<Axis>,
}

impl Sampler<'_> {
    fn k(&self, v: f64) -> Result<Array> {
        Ok(ops::scalar(v, Dtype::F32, self.s)?)
    }

    /// `x` reflected into `[lo, hi]` as ORT's CPU EP does (by whole ranges, then the rest
    /// from the nearer bound, alternating direction).
    fn reflect(&self, x: &Array, axis: &Axis) -> Result<Array> {
        let s = self.s;
        if axis.hi <= axis.lo {
            // One pixel with aligned corners: every coordinate reflects onto it.
            return Ok(ops::broadcast_to(&self.k(axis.lo)?, &x.shape(), s)?);
        }
        let (lo, hi) = (self.k(axis.lo)?, self.k(axis.hi)?);
        let range = self.k(axis.hi - axis.lo)?;
        let two = self.k(2.0)?;
        let fold = |dx: &Array, from_lo: bool| -> Result<Array> {
            let n = ops::trunc(&ops::divide(dx, &range, s)?, s)?;
            let r = ops::subtract(dx, &ops::multiply(&n, &range, s)?, s)?;
            let even = ops::equal(&ops::remainder(&n, &two, s)?, &self.k(0.0)?, s)?;
            let (near, far) = if from_lo {
                (ops::add(&lo, &r, s)?, ops::subtract(&hi, &r, s)?)
            } else {
                (ops::subtract(&hi, &r, s)?, ops::add(&lo, &r, s)?)
            };
            Ok(ops::where_(&even, &near, &far, s)?)
        };
        let below = fold(&ops::subtract(&lo, x, s)?, true)?;
        let above = fold(&ops::subtract(x, &hi, s)?, false)?;
        let x = ops::where_(&ops::less(x, &lo, s)?, &below, x, s)?;
        Ok(ops::where_(&ops::greater(&x, &hi, s)?, &above, &x, s)?)
    }

    /// Clamps `v` to `0..=len - 1`.
    fn clamp(&self, v: &Array, axis: &Axis) -> Result<Array> {
        Ok(ops::clip(v, Some(&self.k(0.0)?), Some(&self.k((axis.len - 1) as f64)?), self.s)?)
    }

    /// The pixels at integer-valued float indices `at` (one `[N, P]` array per spatial axis,
    /// outermost first), with the padding applied to each index: `[N, C, P]`.
    fn pixels(&self, at: &[Array]) -> Result<Array> {
        let s = self.s;
        let mut inside: Option<Array> = None;
        let mut flat: Option<Array> = None;
        for (v, a) in at.iter().zip(&self.axes) {
            let index = match self.padding {
                Padding::Zeros => {
                    let ok = ops::logical_and(
                        &ops::greater_equal(v, &self.k(0.0)?, s)?,
                        &ops::less_equal(v, &self.k((a.len - 1) as f64)?, s)?,
                        s,
                    )?;
                    inside = Some(match inside {
                        Some(all) => ops::logical_and(&all, &ok, s)?,
                        None => ok,
                    });
                    self.clamp(v, a)?
                }
                Padding::Border => self.clamp(v, a)?,
                // Within bounds already; clamped so a read can never leave the image.
                Padding::Reflection => self.clamp(&ops::trunc(&self.reflect(v, a)?, s)?, a)?,
            };
            flat = Some(match flat {
                Some(outer) => ops::add(&ops::multiply(&outer, &self.k(a.len as f64)?, s)?, &index, s)?,
                None => index,
            });
        }
        let flat = flat.ok_or("no spatial axis")?;
        // Clamped again as integers: a NaN coordinate survives the float clamps, and a gather
        // past the image must never happen.
        let size: i64 = self.axes.iter().map(|a| a.len).product();
        let last = ops::scalar((size - 1) as f64, Dtype::I32, s)?;
        let zero = ops::scalar(0.0, Dtype::I32, s)?;
        let index = ops::clip(&ops::astype(&flat, Dtype::I32, s)?, Some(&zero), Some(&last), s)?;
        let index = ops::expand_dims(&index, 1, s)?;
        let shape = self.image.shape();
        let index = ops::broadcast_to(&index, &[shape[0], shape[1], index.shape()[2]], s)?;
        let v = ops::take_along_axis(&self.image, &index, 2, s)?;
        Ok(match inside {
            Some(inside) => ops::where_(&ops::expand_dims(&inside, 1, s)?, &v, &self.k(0.0)?, s)?,
            None => v,
        })
    }
}

/// Cubic convolution weights (A = -0.75) of the four taps around fraction `t`.
fn cubic_weights(t: &Array, s: &Stream) -> Result<[Array; 4]> {
    let a = -0.75;
    let k = |v: f64| ops::scalar(v, Dtype::F32, s);
    // Near taps (|d| <= 1): ((A + 2) d - (A + 3)) d^2 + 1; far (1 < |d| < 2):
    // ((A d - 5A) d + 8A) d - 4A.
    let near = |d: &Array| -> Result<Array> {
        let p = ops::subtract(&ops::multiply(&k(a + 2.0)?, d, s)?, &k(a + 3.0)?, s)?;
        Ok(ops::add(&ops::multiply(&p, &ops::multiply(d, d, s)?, s)?, &k(1.0)?, s)?)
    };
    let far = |d: &Array| -> Result<Array> {
        let p = ops::subtract(&ops::multiply(&k(a)?, d, s)?, &k(5.0 * a)?, s)?;
        let p = ops::add(&ops::multiply(&p, d, s)?, &k(8.0 * a)?, s)?;
        Ok(ops::subtract(&ops::multiply(&p, d, s)?, &k(4.0 * a)?, s)?)
    };
    let one = k(1.0)?;
    let two = k(2.0)?;
    Ok([far(&ops::add(t, &one, s)?)?, near(t)?, near(&ops::subtract(&one, t, s)?)?, far(&ops::subtract(&two, t, s)?)?])
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (mode, padding, align) = attributes(node)?;
    let s = ctx.stream();
    let x = ctx.input(0)?;
    let grid = ctx.input(1)?;
    let (xs, gs) = (x.shape(), grid.shape());
    let dims = xs.len().saturating_sub(2);
    if !(2..=3).contains(&dims) || (dims == 3 && mode == Mode::Cubic) {
        bail!("X has shape {xs:?}; the MLX EP samples two spatial axes, or three without cubic mode");
    }
    let (n, c) = (xs[0], xs[1]);
    if gs.len() != dims + 2 || gs[0] != n || gs[dims + 1] != dims as i64 {
        bail!("grid has shape {gs:?}; X of shape {xs:?} needs [{n}, out..., {dims}]");
    }
    let out_spatial = &gs[1..=dims];
    let points: i64 = out_spatial.iter().product();
    let mut out_shape = vec![n, c];
    out_shape.extend_from_slice(out_spatial);
    if n * c * points == 0 {
        return Ok(vec![ops::broadcast_to(&ops::scalar(0.0, x.dtype(), s)?, &out_shape, s)?]);
    }
    let in_size: i64 = xs[2..].iter().product();
    if in_size == 0 {
        bail!("X has an empty spatial axis (shape {xs:?}): there is nothing to sample");
    }
    let sampler = Sampler {
        s,
        padding,
        image: ops::reshape(x, &[n, c, in_size], s)?,
        axes: xs[2..].iter().map(|&len| Axis::new(len, align)).collect(),
    };
    let g = ops::reshape(grid, &[n, points, dims as i64], s)?;
    let parts = ops::split_at(&g, &(1..dims as i64).collect::<Vec<_>>(), 2, s)?;
    let k = |v: f64| ops::scalar(v, Dtype::F32, s);
    // Normalized to pixel coordinates.
    let denormalize = |v: &Array, len: i64| -> Result<Array> {
        let v = ops::reshape(v, &[n, points], s)?;
        let one = k(1.0)?;
        Ok(if align {
            ops::multiply(&ops::divide(&ops::add(&v, &one, s)?, &k(2.0)?, s)?, &k((len - 1) as f64)?, s)?
        } else {
            let scaled = ops::multiply(&ops::add(&v, &one, s)?, &k(len as f64)?, s)?;
            ops::divide(&ops::subtract(&scaled, &one, s)?, &k(2.0)?, s)?
        })
    };
    // The grid's last axis lists x (innermost) first: reversed to the axes' order.
    let mut coords = Vec::with_capacity(dims);
    for (i, a) in sampler.axes.iter().enumerate() {
        coords.push(denormalize(&parts[dims - 1 - i], a.len)?);
    }
    let wgt = |a: &Array| ops::expand_dims(a, 1, s);
    let y = match mode {
        Mode::Nearest => {
            let at: Vec<Array> = coords.iter().map(|v| ops::round(v, s)).collect::<std::result::Result<_, _>>()?;
            sampler.pixels(&at)?
        }
        Mode::Linear => {
            // Every corner of the cell: per axis the lower index (weight upper - x) or the upper
            // one (weight x - lower).
            let lower: Vec<Array> = coords.iter().map(|v| ops::floor(v, s)).collect::<std::result::Result<_, _>>()?;
            let mut acc: Option<Array> = None;
            for corner in 0..1usize << dims {
                let mut at = Vec::with_capacity(dims);
                let mut weight: Option<Array> = None;
                for d in 0..dims {
                    let upper = corner >> (dims - 1 - d) & 1 == 1;
                    let index = if upper { ops::add(&lower[d], &k(1.0)?, s)? } else { lower[d].clone() };
                    let w = if upper {
                        ops::subtract(&coords[d], &lower[d], s)?
                    } else {
                        ops::subtract(&ops::add(&lower[d], &k(1.0)?, s)?, &coords[d], s)?
                    };
                    weight = Some(match weight {
                        Some(prod) => ops::multiply(&prod, &w, s)?,
                        None => w,
                    });
                    at.push(index);
                }
                let term = ops::multiply(&wgt(&weight.ok_or("no spatial axis")?)?, &sampler.pixels(&at)?, s)?;
                acc = Some(match acc {
                    Some(sum) => ops::add(&sum, &term, s)?,
                    None => term,
                });
            }
            acc.ok_or("no corner")?
        }
        Mode::Cubic => {
            let (py, px) = (&coords[0], &coords[1]);
            let (fx, fy) = (ops::floor(px, s)?, ops::floor(py, s)?);
            let wx = cubic_weights(&ops::subtract(px, &fx, s)?, s)?;
            let wy = cubic_weights(&ops::subtract(py, &fy, s)?, s)?;
            let mut acc: Option<Array> = None;
            for (i, wyi) in wy.iter().enumerate() {
                let r = ops::add(&fy, &k(i as f64 - 1.0)?, s)?;
                let mut row: Option<Array> = None;
                for (j, wxj) in wx.iter().enumerate() {
                    let col = ops::add(&fx, &k(j as f64 - 1.0)?, s)?;
                    let term = ops::multiply(&wgt(wxj)?, &sampler.pixels(&[r.clone(), col])?, s)?;
                    row = Some(match row {
                        Some(sum) => ops::add(&sum, &term, s)?,
                        None => term,
                    });
                }
                let term = ops::multiply(&wgt(wyi)?, &row.ok_or("no tap")?, s)?;
                acc = Some(match acc {
                    Some(sum) => ops::add(&sum, &term, s)?,
                    None => term,
                });
            }
            acc.ok_or("no row")?
        }
    };
    Ok(vec![ops::reshape(&y, &out_shape, s)?])
}

ep_core::register_lowering!(
    GRID_SAMPLE = FnLowering {
        domain: "",
        op: "GridSample",
        opsets: 16..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

fn claim_ms(node: &NodeInfo) -> std::result::Result<(), Decline> {
    claim(node)?;
    match node.input(0).and_then(|v| v.rank()) {
        Some(4) | None => Ok(()),
        Some(r) => Err(Decline(format!("X has rank {r}; com.microsoft GridSample samples two spatial axes"))),
    }
}

// ORT's earlier form (opset 16's names, two spatial axes), the same computation.
ep_core::register_lowering!(
    MS_GRID_SAMPLE = FnLowering {
        domain: "com.microsoft",
        op: "GridSample",
        opsets: 1..=i32::MAX,
        claim: claim_ms,
        lower,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

/// AffineGrid (opset 20): the sampling grid of affine matrices `theta` (`[N, 2, 3]` or
/// `[N, 3, 4]`) over an output of `size` (`[N, C, H, W]` or `[N, C, D, H, W]`): each point's
/// normalized coordinates (x innermost, then y, z), homogeneous, times `theta`.
fn claim_affine(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 2)?;
    require_input_type(node, 0, &[ElemType::F32])?;
    require_input_type(node, 1, &[ElemType::I64])?;
    match node.attr_int("align_corners", 0)? {
        0 | 1 => Ok(()),
        v => Err(Decline(format!("align_corners={v} is not 0 or 1"))),
    }
}

fn lower_affine(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let align = node.attr_int("align_corners", 0)? == 1;
    let theta = ctx.input(0)?.clone();
    let size = ctx.host_i64(1)?;
    let ts = theta.shape();
    let dims = size.len().saturating_sub(2);
    if !(2..=3).contains(&dims) || ts.len() != 3 || ts[0] != size[0] || ts[1] != dims as i64 || ts[2] != dims as i64 + 1
    {
        bail!(
            "theta has shape {ts:?} and size is {size:?}: AffineGrid takes [N, 2, 3] with [N, C, H, W] or [N, 3, 4] with [N, C, D, H, W]"
        );
    }
    let spatial = &size[2..];
    if let Some(&d) = spatial.iter().find(|&&d| d < 1) {
        bail!("size {size:?} has a spatial dimension of {d}; each must be positive (as ORT's CPU EP requires)");
    }
    let mut out_shape = vec![size[0]];
    out_shape.extend_from_slice(spatial);
    out_shape.push(dims as i64 + 1);
    // (Before any host work: the base grid has a row of dims + 1 values per point.)
    ep_core::lowering::check_shape(&out_shape, Dtype::F32)?;
    let points: i64 = spatial.iter().product();
    // Normalized coordinates of one axis, as ONNX's reference computes them.
    // (An axis of one point with align_corners: -1, as ONNX's reference and PyTorch put it;
    // ORT's CPU EP puts it at +1.)
    let line = |n: i64| -> Vec<f64> {
        if align {
            if n == 1 { vec![-1.0] } else { (0..n).map(|i| -1.0 + 2.0 * i as f64 / (n - 1) as f64).collect() }
        } else {
            let step = 2.0 / n as f64;
            (0..n).map(|i| -1.0 + step / 2.0 + step * i as f64).collect()
        }
    };
    let lines: Vec<Vec<f64>> = spatial.iter().map(|&n| line(n)).collect();
    // Rows of (x, y[, z], 1), points in row-major order of the spatial axes.
    let mut base = Vec::with_capacity((points as usize) * (dims + 1));
    for p in 0..points {
        let mut rest = p;
        let mut at = vec![0i64; dims];
        for d in (0..dims).rev() {
            at[d] = rest % spatial[d];
            rest /= spatial[d];
        }
        for d in (0..dims).rev() {
            base.push(lines[d][at[d] as usize] as f32);
        }
        base.push(1.0);
    }
    let s = ctx.stream();
    let base = Array::from_slice(&base, &[points, dims as i64 + 1])?;
    // [P, dims + 1] x [N, dims + 1, dims] -> [N, P, dims].
    let grid = ops::matmul(&base, &ops::transpose_axes(&theta, &[0, 2, 1], s)?, s)?;
    *out_shape.last_mut().expect("the point axis") = dims as i64;
    Ok(vec![ops::reshape(&grid, &out_shape, s)?])
}

ep_core::register_lowering!(
    AFFINE_GRID = FnLowering {
        domain: "",
        op: "AffineGrid",
        opsets: 20..=i32::MAX,
        claim: claim_affine,
        lower: lower_affine,
        safety: CompileSafety::ShapeKeyed,
        growth: None,
    }
);

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::GRID_SAMPLE, || {
        (
            (1..=2i64, 1..=3i64, collection::vec(1..=5i64, 3), collection::vec(1..=4i64, 3)),
            select(&["nearest", "linear", "cubic"][..]),
            select(&["zeros", "border", "reflection"][..]),
            any::<(bool, bool, bool)>(),
            seed(),
        )
            .prop_map(|((n, c, input, output), mode, padding, (align, v20, volume), seed)| {
                // Three spatial axes without cubic mode (ORT's CPU EP has none).
                let dims = if volume && mode != "cubic" { 3 } else { 2 };
                let (v, mode) = if v20 {
                    (20, mode)
                } else {
                    (
                        16,
                        match mode {
                            "linear" => "bilinear",
                            "cubic" => "bicubic",
                            m => m,
                        },
                    )
                };
                let mut x = vec![n, c];
                x.extend_from_slice(&input[..dims]);
                let mut grid = vec![n];
                grid.extend_from_slice(&output[..dims]);
                grid.push(dims as i64);
                let mut y = vec![n, c];
                y.extend_from_slice(&output[..dims]);
                // Points past the image too, so every padding mode is exercised.
                Case::op("GridSample", v)
                    .with_seed(seed)
                    .input("X", DType::F32, &x)
                    .input_with("grid", DType::F32, &grid, Values::Uniform { lo: -1.6, hi: 1.6 })
                    .attr_str("mode", mode)
                    .attr_str("padding_mode", padding)
                    .attr_int("align_corners", align as i64)
                    .output("Y", DType::F32, &y)
            })
            .boxed()
    });

    register_spec!(super::MS_GRID_SAMPLE, || {
        (
            (1..=2i64, 1..=3i64, collection::vec(1..=5i64, 2), collection::vec(1..=4i64, 2)),
            select(&["nearest", "bilinear", "bicubic"][..]),
            select(&["zeros", "border", "reflection"][..]),
            any::<bool>(),
            seed(),
        )
            .prop_map(|((n, c, input, output), mode, padding, align, seed)| {
                Case::domain_op("com.microsoft", "GridSample", 1)
                    .with_seed(seed)
                    .input("X", DType::F32, &[n, c, input[0], input[1]])
                    .input_with(
                        "grid",
                        DType::F32,
                        &[n, output[0], output[1], 2],
                        Values::Uniform { lo: -1.6, hi: 1.6 },
                    )
                    .attr_str("mode", mode)
                    .attr_str("padding_mode", padding)
                    .attr_int("align_corners", align as i64)
                    .output("Y", DType::F32, &[n, c, output[0], output[1]])
            })
            .boxed()
    });

    register_spec!(super::AFFINE_GRID, || {
        (1..=2i64, 1..=3i64, collection::vec(1..=5i64, 3), any::<(bool, bool)>(), seed())
            .prop_map(|(n, c, mut spatial, (align, volume), seed)| {
                let dims = if volume { 3 } else { 2 };
                // An axis of 1 with align_corners: ONNX's reference (and PyTorch) put its point
                // at -1, as the MLX EP does; ORT's CPU EP at +1.
                if align {
                    spatial.iter_mut().for_each(|d| *d = (*d).max(2));
                }
                let mut size = vec![n, c];
                size.extend_from_slice(&spatial[..dims]);
                let mut grid = vec![n];
                grid.extend_from_slice(&spatial[..dims]);
                grid.push(dims as i64);
                Case::op("AffineGrid", 20)
                    .with_seed(seed)
                    .input_with(
                        "theta",
                        DType::F32,
                        &[n, dims as i64, dims as i64 + 1],
                        Values::Uniform { lo: -1.5, hi: 1.5 },
                    )
                    .constant_i64("size", &size)
                    .attr_int("align_corners", align as i64)
                    .output("grid", DType::F32, &grid)
            })
            .boxed()
    });
}
