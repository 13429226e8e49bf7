//! The extension contract: how an op crate teaches the EP a new op.
//!
//! An op is one type implementing [`Lowering`] plus one [`register_lowering!`](crate::register_lowering) line:
//!
//! ```ignore
//! use ep_core::{Decline, LowerCtx, Lowering, NodeInfo, Result, mlx};
//!
//! struct Exp;
//! impl Lowering for Exp {
//!     fn op_type(&self) -> &'static str { "Exp" }
//!     fn opsets(&self) -> std::ops::RangeInclusive<i32> { 6..=i32::MAX }
//!     fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
//!         ep_core::lowering::require_types(node, ep_core::lowering::FLOATS)
//!     }
//!     fn lower(&self, ctx: &mut LowerCtx<'_>, _node: &NodeInfo) -> Result<Vec<mlx::Array>> {
//!         Ok(vec![mlx::ops::exp(ctx.input(0)?, ctx.stream())?])
//!     }
//! }
//! ep_core::register_lowering!(EXP = Exp);
//! ```
//!
//! Rules a lowering follows: `claim` accepts exactly what `lower` can run (dtypes, ranks,
//! attributes) and says why it declines anything else; `lower` only builds MLX graph nodes
//! (no evaluation, no IO) and returns one array per node output, in order.

mod checks;
mod facts;
mod subgraphs;
pub use checks::{Check, Checked};
pub use facts::{AffineWeight, SharedValues, dense_from_rows};

use crate::error::{Error, Result};
use crate::graph::NodeInfo;
use crate::growth::{GrowthQuery, GrowthResult};
use crate::mlx::{Array, Stream};
use std::ops::RangeInclusive;

pub use crate::claims::*;

/// What a lowering's graph may be compiled under (`mlx_compile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompileSafety {
    /// Shape-agnostic: one trace serves every input shape (shapeless compile). The lowering
    /// reads no dimension of its inputs while building.
    Shapeless,
    /// Correct when compiled for one set of input shapes (it reads dimensions while building,
    /// e.g. to compute a reshape): a new trace per shape.
    ShapeKeyed,
    /// Must run eagerly (data-dependent shapes, host reads of values).
    Never,
}

/// One op (domain, type, opset range) the EP can run on MLX.
pub trait Lowering: Sync + 'static {
    /// The op's domain; `""` is the default ONNX domain.
    fn domain(&self) -> &'static str {
        ""
    }

    fn op_type(&self) -> &'static str;

    /// The opset versions (the node's `since_version`) this lowering implements.
    fn opsets(&self) -> RangeInclusive<i32>;

    /// Whether this node can run: dtypes, ranks, attributes. `Err` gives the reason.
    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline>;

    /// Builds the MLX graph for the node from its inputs; one array per output.
    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>>;

    /// Under which compilation the graph this lowering builds stays correct. The default is
    /// the conservative [`CompileSafety::ShapeKeyed`].
    fn compile_safety(&self) -> CompileSafety {
        CompileSafety::ShapeKeyed
    }

    /// How the node's outputs grow when some of its inputs grow from run to run: the decode
    /// slot replays one shapeless trace across such runs only if every node answers. The
    /// default follows [`Self::compile_safety`] (see [`crate::growth::by_safety`]).
    fn growth(&self, query: &GrowthQuery<'_>) -> GrowthResult {
        crate::growth::by_safety(self.compile_safety() == CompileSafety::Shapeless, query)
    }

    /// A name for diagnostics (the implementing type by default).
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }

    /// Whether the lowering reads or writes ONNX's float8 types and float4e2m1, which reach it
    /// as their codes in uint8 arrays ([`crate::float8`], [`crate::float4`]). A node with such
    /// an input or output is claimed only by a lowering that says so (wrap it in
    /// [`TakesFloat8`]): to any other, those codes would pass for integers.
    fn takes_float8(&self) -> bool {
        false
    }
}

/// A lowering that reads or writes float8 values as their bytes ([`Lowering::takes_float8`]).
pub struct TakesFloat8<L>(pub L);

impl<L: Lowering> Lowering for TakesFloat8<L> {
    fn domain(&self) -> &'static str {
        self.0.domain()
    }
    fn op_type(&self) -> &'static str {
        self.0.op_type()
    }
    fn opsets(&self) -> RangeInclusive<i32> {
        self.0.opsets()
    }
    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        self.0.claim(node)
    }
    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        self.0.lower(ctx, node)
    }
    fn compile_safety(&self) -> CompileSafety {
        self.0.compile_safety()
    }
    fn growth(&self, query: &GrowthQuery<'_>) -> GrowthResult {
        self.0.growth(query)
    }
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn takes_float8(&self) -> bool {
        true
    }
}

/// A lowering made of two functions, for ops that need no state of their own:
///
/// ```ignore
/// ep_core::register_lowering!(RESHAPE = FnLowering {
///     domain: "", op: "Reshape", opsets: 5..=i32::MAX,
///     claim: claim_reshape, lower: lower_reshape, safety: CompileSafety::ShapeKeyed,
///     growth: None,
/// });
/// ```
pub struct FnLowering {
    pub domain: &'static str,
    pub op: &'static str,
    pub opsets: RangeInclusive<i32>,
    pub claim: fn(&NodeInfo) -> std::result::Result<(), Decline>,
    pub lower: fn(&mut LowerCtx<'_>, &NodeInfo) -> Result<Vec<Array>>,
    pub safety: CompileSafety,
    /// The answer to [`Lowering::growth`]; `None`: the default for `safety`.
    pub growth: Option<fn(&GrowthQuery<'_>) -> GrowthResult>,
}

impl Lowering for FnLowering {
    fn domain(&self) -> &'static str {
        self.domain
    }

    fn op_type(&self) -> &'static str {
        self.op
    }

    fn opsets(&self) -> RangeInclusive<i32> {
        self.opsets.clone()
    }

    fn claim(&self, node: &NodeInfo) -> std::result::Result<(), Decline> {
        (self.claim)(node)
    }

    fn lower(&self, ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
        (self.lower)(ctx, node)
    }

    fn compile_safety(&self) -> CompileSafety {
        self.safety
    }

    fn growth(&self, query: &GrowthQuery<'_>) -> GrowthResult {
        match self.growth {
            Some(f) => f(query),
            None => crate::growth::by_safety(self.safety == CompileSafety::Shapeless, query),
        }
    }

    fn name(&self) -> &'static str {
        self.op
    }
}

/// What a lowering gets to build with: the node's input arrays, the stream to build on, and a
/// session cache for work done on constant inputs.
pub struct LowerCtx<'a> {
    inputs: Vec<Option<Array>>,
    /// For each input that is a constant of the partition: its identity (the address of its
    /// shared MLX copy), for the engine's cache of derived constants.
    constants: Vec<Option<usize>>,
    /// What the engine lends beyond the inputs (derived constants, subgraph evaluation).
    engine: Option<&'a dyn Engine>,
    stream: &'a Stream,
    cpu: &'a Stream,
    /// Building inside a compiled trace: no host reads, no in-place updates.
    tracing: bool,
    /// Building the decode slot's shapeless trace (see [`LowerCtx::shapeless`]).
    shapeless: bool,
    row_updates: Vec<RowUpdate>,
    guards: Vec<Check>,
    checks: Vec<Check>,
    /// Values of enclosing scopes by name (the node's implicit inputs), for its subgraphs.
    scope: Option<&'a std::collections::HashMap<String, Array>>,
    /// Per input, which value of the partition it is (equal keys: the same array), and the
    /// values lowerings share within one build (see [`LowerCtx::shared`]).
    sources: Vec<String>,
    memo: Option<&'a SharedValues>,
    /// Per output, which value of the partition it is (the key its consumers' `sources` hold),
    /// and the nodes that read it (qualified op type, input index).
    output_keys: Vec<String>,
    output_readers: Vec<Vec<(&'a NodeInfo, usize)>>,
}

/// What the engine lends a lowering beyond its inputs; implemented by the engine (`exec`), so
/// this contract depends on nothing above it.
pub(crate) trait Engine {
    /// `compute()`'s arrays for the constants `ids` and `tag`, computed and evaluated once and
    /// then reused (across sessions too).
    fn derived(
        &self,
        ids: Vec<usize>,
        tag: &str,
        compute: &mut dyn FnMut() -> Result<Vec<Array>>,
    ) -> Result<Vec<Array>>;

    /// How many times the random node `node` has drawn in this plan before (0 the first
    /// time), counting this draw.
    fn next_draw(&self, node: &str) -> u64;

    /// Evaluates `graph` on `inputs` (bound to its formal inputs in order) with the engine's
    /// translator; names it does not define resolve in `scope`. Data checks its nodes declare
    /// go to `checks`, guards to `guards`.
    fn subgraph(&self, graph: &crate::graph::Subgraph, inputs: Vec<Array>, at: SubgraphCall<'_>) -> Result<Vec<Array>>;

    /// [`Self::subgraph`] as a compiled closure over `inputs` and the enclosing values
    /// `outer` (the names the subgraph reads without defining them, with their arrays),
    /// traced once per key of their dtypes and shapes and replayed; data checks go to
    /// `checks`. `None` where it is not compiled (inside a trace, or its trace failed once,
    /// the reason recorded): the caller builds it node by node.
    fn compiled_subgraph(
        &self,
        graph: &crate::graph::Subgraph,
        inputs: Vec<Array>,
        outer: Vec<(String, Array)>,
        at: SubgraphCall<'_>,
    ) -> Result<Option<Vec<Array>>>;
}

/// Where a subgraph is evaluated from: the calling node's streams, trace mode and scope.
pub(crate) struct SubgraphCall<'c> {
    pub stream: &'c Stream,
    pub cpu: &'c Stream,
    pub tracing: bool,
    pub shapeless: bool,
    pub scope: Option<&'c std::collections::HashMap<String, Array>>,
    pub checks: &'c mut Vec<Check>,
    pub guards: &'c mut Vec<Check>,
}

/// A lowering's declaration that node output `aliased_output` is node input `input` with only
/// some rows along `axis` changed (a KV cache append): when ORT gives that output the input's
/// own buffer, only those rows are written (see [`LowerCtx::write_back_rows`] and
/// [`LowerCtx::write_rows_at`]).
pub struct RowUpdate {
    pub input: usize,
    pub axis: usize,
    pub aliased_output: usize,
    pub rows: ChangedRows,
}

/// Which rows of a [`RowUpdate`] changed.
pub enum ChangedRows {
    /// Known while building: the whole updated value (the input's shape and dtype) and the
    /// changed rows as (index over the dimensions before `axis`, flattened; range of rows).
    Known { updated: Array, patches: Vec<(usize, std::ops::Range<usize>)> },
    /// Positions that are data: the new rows (the input's shape with `S` along `axis`) and
    /// `[B]` int32 starts, evaluated with the outputs.
    At { rows: Array, starts: Array },
}

impl<'a> LowerCtx<'a> {
    /// A context over plain inputs (no constants, no engine: derived values are computed on
    /// every call and subgraphs cannot run).
    pub fn new(inputs: Vec<Option<Array>>, stream: &'a Stream, cpu: &'a Stream) -> LowerCtx<'a> {
        let constants = vec![None; inputs.len()];
        LowerCtx::for_node(inputs, constants, None, stream, cpu, false, false, None).with_sources(Vec::new(), None)
    }

    /// The context the engine builds for one node: its inputs, their constant identities, the
    /// engine's services, the streams, the trace mode and the enclosing scope.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn for_node(
        inputs: Vec<Option<Array>>,
        constants: Vec<Option<usize>>,
        engine: Option<&'a dyn Engine>,
        stream: &'a Stream,
        cpu: &'a Stream,
        tracing: bool,
        shapeless: bool,
        scope: Option<&'a std::collections::HashMap<String, Array>>,
    ) -> LowerCtx<'a> {
        LowerCtx {
            inputs,
            constants,
            engine,
            stream,
            cpu,
            tracing,
            shapeless,
            row_updates: Vec::new(),
            guards: Vec::new(),
            checks: Vec::new(),
            scope,
            sources: Vec::new(),
            memo: None,
            output_keys: Vec::new(),
            output_readers: Vec::new(),
        }
    }

    /// Which partition value each input and each output is, and the build's shared values.
    pub(crate) fn with_sources(mut self, sources: Vec<String>, memo: Option<&'a SharedValues>) -> LowerCtx<'a> {
        self.sources = sources;
        self.memo = memo;
        self
    }

    pub(crate) fn with_outputs(mut self, keys: Vec<String>, readers: Vec<Vec<(&'a NodeInfo, usize)>>) -> LowerCtx<'a> {
        self.output_keys = keys;
        self.output_readers = readers;
        self
    }

    pub(crate) fn take_row_updates(&mut self) -> Vec<RowUpdate> {
        std::mem::take(&mut self.row_updates)
    }

    pub(crate) fn take_guards(&mut self) -> Vec<Check> {
        std::mem::take(&mut self.guards)
    }

    pub(crate) fn take_checks(&mut self) -> Vec<Check> {
        std::mem::take(&mut self.checks)
    }

    /// Whether the graph being built is the decode slot's shapeless trace: it is replayed
    /// while the dimensions that grow from run to run (a KV cache's length, an attention
    /// mask's) change, every other dimension staying as traced. A lowering that reads such a
    /// dimension must then build shape-agnostic operations on it (concatenation, reductions,
    /// MLX's fused attention), never constants of the traced size (an `arange`, a `full`, a
    /// pad width), which a replay would silently keep; operations that bake a shape (reshape,
    /// slice) are refused by MLX on replay, which sends the partition back to the shape-keyed
    /// slot. Where correctness rests on input data (no padding in a KV cache), declare it with
    /// [`LowerCtx::guard`].
    pub fn shapeless(&self) -> bool {
        self.shapeless
    }

    /// The values of integer input `i` on the host. A constant input is read from its host copy
    /// (also inside a compiled trace: constants are fixed for the session). Any other input is
    /// evaluated: values computed only from shapes and constants (a `Shape -> Gather -> Concat`
    /// chain) evaluate inside a shape-keyed trace too, while values that depend on a runtime
    /// input's data make the trace fail, which sends the partition to the eager path.
    pub fn host_i64(&self, i: usize) -> Result<Vec<i64>> {
        if let Some(v) = self.constant_i64(i)? {
            return Ok(v);
        }
        let a = crate::mlx::ops::astype(self.input(i)?, crate::mlx::Dtype::I64, self.cpu)?;
        a.to_vec::<i64>(self.cpu).map_err(|e| {
            if self.tracing {
                Error::new(format!("input {i} is data-dependent and is read on the host ({e})"))
            } else {
                Error::from(e)
            }
        })
    }

    /// The values of a constant integer input, `None` when input `i` is not a constant.
    pub fn constant_i64(&self, i: usize) -> Result<Option<Vec<i64>>> {
        if !self.is_constant(i) {
            return Ok(None);
        }
        let a = self.input(i)?;
        let Some(bytes) = a.host_bytes() else { return Ok(None) };
        let v = match a.dtype() {
            crate::mlx::Dtype::I64 => {
                bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
            }
            crate::mlx::Dtype::I32 => {
                bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect()
            }
            other => return Err(Error::new(format!("input {i} is {other:?}, not an integer tensor"))),
        };
        Ok(Some(v))
    }

    /// The values of float input `i` on the host (as [`Self::host_i64`]).
    pub fn host_f64(&self, i: usize) -> Result<Vec<f64>> {
        let a = crate::mlx::ops::astype(self.input(i)?, crate::mlx::Dtype::F64, self.cpu)?;
        a.to_vec::<f64>(self.cpu).map_err(|e| Error::new(format!("input {i} cannot be read on the host ({e})")))
    }

    /// The one value of input `i` on the host (a quantization scale or zero point: a scalar
    /// or a vector of one element, as ORT's CPU EP requires), read as [`Self::host_f64`]
    /// does; `None` when the optional input is absent. `what` names it in the error.
    pub fn host_one_f32(&self, i: usize, what: &str) -> Result<Option<f32>> {
        if self.optional_input(i).is_none() {
            return Ok(None);
        }
        let v = self.host_f64(i)?;
        let shape = self.input(i)?.shape();
        if v.len() != 1 || shape.len() > 1 {
            return Err(Error::new(format!(
                "{what} (input {i}) of shape {shape:?} must be a scalar or a vector of one element"
            )));
        }
        Ok(Some(v[0] as f32))
    }

    /// Whether the lowering is running inside a compiled trace.
    pub fn tracing(&self) -> bool {
        self.tracing
    }

    /// Declares that node output `aliased_output` is input `input` with only some rows changed
    /// (a KV cache append). When ORT binds that output to the input's own buffer (a cache
    /// shared by past and present), only the changed rows are copied into it instead of the
    /// whole tensor; otherwise the output is copied as usual and the input is never touched.
    /// `updated` must have the input's shape and dtype; `patches` are (index over the
    /// dimensions before `axis`, flattened; range of rows along `axis`). Not available inside a
    /// compiled trace (the partition then runs eagerly).
    pub fn write_back_rows(
        &mut self,
        input: usize,
        updated: &Array,
        axis: usize,
        patches: Vec<(usize, std::ops::Range<usize>)>,
        aliased_output: usize,
    ) -> Result<()> {
        if self.tracing {
            return Err(Error::new("in-place updates of inputs are not recorded inside a compiled trace"));
        }
        let original = self.input(input)?;
        if original.shape() != updated.shape() || original.dtype() != updated.dtype() {
            return Err(Error::new(format!(
                "the update of input {input} is {:?}{:?}; the input is {:?}{:?}",
                updated.dtype(),
                updated.shape(),
                original.dtype(),
                original.shape()
            )));
        }
        let rows = ChangedRows::Known { updated: updated.clone(), patches };
        self.row_updates.push(RowUpdate { input, axis, aliased_output, rows });
        Ok(())
    }

    /// Declares that node output `aliased_output` is input `input` (shape `[B, .., L, ..]`)
    /// with, for each batch entry `b`, rows `starts[b] .. starts[b] + S` along `axis` replaced
    /// by `rows[b]` (`rows`: the input's shape with `S` along `axis`; `starts`: `[B]` int32,
    /// computed in the graph). Unlike [`Self::write_back_rows`] the positions are data, so this
    /// works inside compiled traces: the engine evaluates `rows` and `starts` with the outputs
    /// and, when ORT binds the output to the input's own buffer (a KV cache shared by past and
    /// present), copies only those rows; otherwise the output is copied whole.
    pub fn write_rows_at(
        &mut self,
        input: usize,
        rows: &Array,
        starts: &Array,
        axis: usize,
        aliased_output: usize,
    ) -> Result<()> {
        let original = self.input(input)?;
        let (os, rs) = (original.shape(), rows.shape());
        let fits = os.len() == rs.len()
            && axis > 0
            && axis < os.len()
            && (0..os.len()).all(|d| d == axis || os[d] == rs[d])
            && rs[axis] <= os[axis];
        if !fits || original.dtype() != rows.dtype() {
            return Err(Error::new(format!(
                "rows {:?}{rs:?} do not fit input {input} {:?}{os:?} along axis {axis}",
                rows.dtype(),
                original.dtype()
            )));
        }
        let starts = crate::mlx::ops::astype(starts, crate::mlx::Dtype::I32, self.stream)?;
        let starts = crate::mlx::ops::reshape(&starts, &[os[0]], self.stream)?;
        // (Not made contiguous here: a compiled graph packs the rows of a run into one array,
        // which lays them out; an eager run makes them contiguous itself.)
        let rows = rows.clone();
        self.row_updates.push(RowUpdate { input, axis, aliased_output, rows: ChangedRows::At { rows, starts } });
        Ok(())
    }

    /// Input `i`; an error when it is absent.
    pub fn input(&self, i: usize) -> Result<&Array> {
        self.optional_input(i).ok_or_else(|| Error::new(format!("required input {i} is missing")))
    }

    /// Input `i`, `None` when the optional input is omitted.
    pub fn optional_input(&self, i: usize) -> Option<&Array> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Whether input `i` is a constant (an initializer) of the partition.
    pub fn is_constant(&self, i: usize) -> bool {
        self.constants.get(i).is_some_and(Option::is_some)
    }

    /// The stream to build on (the default device's).
    pub fn stream(&self) -> &'a Stream {
        self.stream
    }

    /// The CPU stream: for small integer shape arithmetic, which should never round-trip
    /// through a GPU, and for float64, which MLX GPUs do not support.
    pub fn cpu_stream(&self) -> &'a Stream {
        self.cpu
    }

    /// The stream for work on `dtype`: the CPU stream for float64, else [`Self::stream`].
    pub fn stream_for(&self, dtype: crate::mlx::Dtype) -> &'a Stream {
        if dtype == crate::mlx::Dtype::F64 { self.cpu } else { self.stream }
    }

    /// The key a random node with a `seed` draws with on this run: the seed's own key on its
    /// first draw in the session, then a new key per draw, a sequence fixed by the seed (ORT's
    /// CPU EP seeds a node's generator once and draws on from it run after run). Outside a
    /// partition (no engine), the seed's own key.
    pub fn seeded_key(&self, node: &NodeInfo, seed: u64) -> Result<Array> {
        let n = self.engine.map_or(0, |e| e.next_draw(&node.name));
        // SplitMix64's finalizer spreads (seed, draw) over the key space.
        let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if n > 0 {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
        }
        Ok(crate::mlx::random::key(z)?)
    }

    /// `transform(input i)`. When input `i` is a constant, the result is computed and
    /// evaluated once (per constant and `tag`) and reused by every later run, by every node
    /// asking for the same `tag` of the same constant, and by other sessions holding the same
    /// weights (constants are shared by content): weight transposes, casts and repacks cost
    /// nothing after the first run. `tag` names the transform and must determine it completely.
    pub fn derived(
        &self,
        i: usize,
        tag: &str,
        transform: impl FnOnce(&Array, &Stream) -> Result<Array>,
    ) -> Result<Array> {
        let mut out = self.derived_many(&[i], tag, |args, s| Ok(vec![transform(args[0], s)?]))?;
        Ok(out.remove(0))
    }

    /// [`Self::derived`] over several inputs and with several results (a weight, its scales
    /// and zero points repacked together). Cached only when every listed input is a constant;
    /// otherwise `transform` runs on each call.
    pub fn derived_many(
        &self,
        inputs: &[usize],
        tag: &str,
        transform: impl FnOnce(&[&Array], &Stream) -> Result<Vec<Array>>,
    ) -> Result<Vec<Array>> {
        let args: Vec<&Array> = inputs.iter().map(|&i| self.input(i)).collect::<Result<_>>()?;
        let ids: Option<Vec<usize>> = inputs.iter().map(|&i| self.constants.get(i).copied().flatten()).collect();
        match (ids, self.engine) {
            (Some(ids), Some(engine)) => {
                let mut transform = Some(transform);
                let stream = self.stream;
                engine.derived(ids, tag, &mut || match transform.take() {
                    Some(f) => f(&args, stream),
                    None => Err(Error::new("a derived constant's transform ran twice")),
                })
            }
            _ => transform(&args, self.stream),
        }
    }
}
