//! GridSample (opset 16 on) over two spatial axes: `X` `[N, C, H, W]` sampled at the normalized
//! points of `grid` `[N, Ho, Wo, 2]` (x along W, y along H) by nearest, bilinear or bicubic
//! interpolation, with zeros, border or reflection padding and both `align_corners` forms, as
//! ORT's CPU EP computes them: the padding applies to each pixel read (a zero outside, the
//! index clamped, or the index reflected by the bounds `align_corners` sets), the weights come
//! from the unpadded coordinates. The samples are gathers from the flattened image, the
//! weights elementwise.

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
    attributes(node).map_err(Decline)?;
    match node.input(0).and_then(|v| v.rank()) {
        Some(4) | None => Ok(()),
        Some(r) => Err(Decline(format!("X has rank {r}; the MLX EP samples two spatial axes (rank 4)"))),
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
    /// `X` as `[N, C, H * W]`.
    image: Array,
    h: Axis,
    w: Axis,
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

    /// The pixels at integer-valued float indices `(r, c)` (`[N, P]`), with the padding applied
    /// to each index: `[N, C, P]`.
    fn pixels(&self, r: &Array, c: &Array) -> Result<Array> {
        let s = self.s;
        let (r, c, inside) = match self.padding {
            Padding::Zeros => {
                let ok = |v: &Array, a: &Axis| -> Result<Array> {
                    Ok(ops::logical_and(
                        &ops::greater_equal(v, &self.k(0.0)?, s)?,
                        &ops::less_equal(v, &self.k((a.len - 1) as f64)?, s)?,
                        s,
                    )?)
                };
                let inside = ops::logical_and(&ok(r, &self.h)?, &ok(c, &self.w)?, s)?;
                (self.clamp(r, &self.h)?, self.clamp(c, &self.w)?, Some(inside))
            }
            Padding::Border => (self.clamp(r, &self.h)?, self.clamp(c, &self.w)?, None),
            Padding::Reflection => {
                let r = ops::trunc(&self.reflect(r, &self.h)?, s)?;
                let c = ops::trunc(&self.reflect(c, &self.w)?, s)?;
                // Within bounds already; clamped so a read can never leave the image.
                (self.clamp(&r, &self.h)?, self.clamp(&c, &self.w)?, None)
            }
        };
        let flat = ops::add(&ops::multiply(&r, &self.k(self.w.len as f64)?, s)?, &c, s)?;
        // Clamped again as integers: a NaN coordinate survives the float clamps, and a gather
        // past the image must never happen.
        let last = ops::scalar((self.h.len * self.w.len - 1) as f64, Dtype::I32, s)?;
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
    if xs.len() != 4 {
        bail!("X has shape {xs:?}; the MLX EP samples two spatial axes (rank 4)");
    }
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    if gs.len() != 4 || gs[0] != n || gs[3] != 2 {
        bail!("grid has shape {gs:?}; X of shape {xs:?} needs [{n}, H_out, W_out, 2]");
    }
    let (ho, wo) = (gs[1], gs[2]);
    let points = ho * wo;
    if n * c * points == 0 {
        return Ok(vec![ops::broadcast_to(&ops::scalar(0.0, x.dtype(), s)?, &[n, c, ho, wo], s)?]);
    }
    if h * w == 0 {
        bail!("X has an empty spatial axis (shape {xs:?}): there is nothing to sample");
    }
    let sampler = Sampler {
        s,
        padding,
        image: ops::reshape(x, &[n, c, h * w], s)?,
        h: Axis::new(h, align),
        w: Axis::new(w, align),
    };
    let g = ops::reshape(grid, &[n, points, 2], s)?;
    let parts = ops::split_at(&g, &[1], 2, s)?;
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
    let mut px = denormalize(&parts[0], w)?;
    let mut py = denormalize(&parts[1], h)?;
    if mode == Mode::Nearest {
        px = ops::round(&px, s)?;
        py = ops::round(&py, s)?;
    }
    let y = match mode {
        Mode::Nearest => sampler.pixels(&py, &px)?,
        Mode::Linear => {
            let (x1, y1) = (ops::floor(&px, s)?, ops::floor(&py, s)?);
            let (x2, y2) = (ops::add(&x1, &k(1.0)?, s)?, ops::add(&y1, &k(1.0)?, s)?);
            let (dx1, dx2) = (ops::subtract(&px, &x1, s)?, ops::subtract(&x2, &px, s)?);
            let (dy1, dy2) = (ops::subtract(&py, &y1, s)?, ops::subtract(&y2, &py, s)?);
            let wgt = |a: &Array| ops::expand_dims(a, 1, s);
            let row = |r: &Array, dx1: &Array, dx2: &Array| -> Result<Array> {
                let left = ops::multiply(&wgt(dx2)?, &sampler.pixels(r, &x1)?, s)?;
                let right = ops::multiply(&wgt(dx1)?, &sampler.pixels(r, &x2)?, s)?;
                Ok(ops::add(&left, &right, s)?)
            };
            let top = ops::multiply(&wgt(&dy2)?, &row(&y1, &dx1, &dx2)?, s)?;
            let bottom = ops::multiply(&wgt(&dy1)?, &row(&y2, &dx1, &dx2)?, s)?;
            ops::add(&top, &bottom, s)?
        }
        Mode::Cubic => {
            let (fx, fy) = (ops::floor(&px, s)?, ops::floor(&py, s)?);
            let wx = cubic_weights(&ops::subtract(&px, &fx, s)?, s)?;
            let wy = cubic_weights(&ops::subtract(&py, &fy, s)?, s)?;
            let mut acc: Option<Array> = None;
            for (i, wyi) in wy.iter().enumerate() {
                let r = ops::add(&fy, &k(i as f64 - 1.0)?, s)?;
                let mut row: Option<Array> = None;
                for (j, wxj) in wx.iter().enumerate() {
                    let col = ops::add(&fx, &k(j as f64 - 1.0)?, s)?;
                    let term = ops::multiply(&ops::expand_dims(wxj, 1, s)?, &sampler.pixels(&r, &col)?, s)?;
                    row = Some(match row {
                        Some(sum) => ops::add(&sum, &term, s)?,
                        None => term,
                    });
                }
                let term = ops::multiply(&ops::expand_dims(wyi, 1, s)?, &row.expect("four taps"), s)?;
                acc = Some(match acc {
                    Some(sum) => ops::add(&sum, &term, s)?,
                    None => term,
                });
            }
            acc.expect("four rows")
        }
    };
    Ok(vec![ops::reshape(&y, &[n, c, ho, wo], s)?])
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

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::GRID_SAMPLE, || {
        (
            (1..=2i64, 1..=3i64, 1..=5i64, 1..=5i64),
            (1..=4i64, 1..=4i64),
            select(&["nearest", "linear", "cubic"][..]),
            select(&["zeros", "border", "reflection"][..]),
            any::<(bool, bool)>(),
            seed(),
        )
            .prop_map(|((n, c, h, w), (ho, wo), mode, padding, (align, v20), seed)| {
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
                // Points past the image too, so every padding mode is exercised.
                Case::op("GridSample", v)
                    .with_seed(seed)
                    .input("X", DType::F32, &[n, c, h, w])
                    .input_with("grid", DType::F32, &[n, ho, wo, 2], Values::Uniform { lo: -1.6, hi: 1.6 })
                    .attr_str("mode", mode)
                    .attr_str("padding_mode", padding)
                    .attr_int("align_corners", align as i64)
                    .output("Y", DType::F32, &[n, c, ho, wo])
            })
            .boxed()
    });
}
