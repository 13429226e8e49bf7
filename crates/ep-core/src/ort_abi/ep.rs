//! The `OrtEp` table: claiming nodes (GetCapability) and compiling partitions (Compile).

use super::boundary::{guard, guard_value, non_null};
use super::compute::ComputeInfo;
use super::graph_reader::{self, graph_nodes, node_inputs, node_outputs, read_node};
use super::tables::{OrtEp, OrtEpGraphSupportInfo, OrtNodeComputeInfo, OrtNodeFusionOptions, TABLE_VERSION};
use super::{check_status, ep_api, ort_call};
use crate::exec::Plan;
use crate::graph::ElemType;
use crate::graph::NodeInfo;
use crate::options::Options;
use crate::partition::{PartNode, partition, topological_order};
use crate::stats::SessionStats;
use crate::{EP_NAME, Error, Result, registry};
use ort_sys::{OrtGraph, OrtKeyValuePairs, OrtNode, OrtSessionOptions, OrtStatusPtr, OrtValueInfo};
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char};
use std::sync::Arc;

const COMPAT: &CStr = c"onnxruntime-mlx";

/// One EP instance (one per session); `table` must stay the first field.
#[repr(C)]
pub struct Ep {
    table: OrtEp,
    options: Options,
    stats: Arc<SessionStats>,
}

impl Drop for Ep {
    fn drop(&mut self) {
        if self.options.verbose {
            eprint!("{}", self.stats.summary());
        }
        self.stats.finish();
    }
}

impl Ep {
    /// An EP for one session, configured by the session's provider options (an unknown key
    /// or a bad value is an error naming it).
    pub fn new(session_options: *const OrtSessionOptions) -> Result<Box<Ep>> {
        let entries = session_entries(session_options)?;
        let options = Options::resolve(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| Error::new(format!("{EP_NAME}: {e}")))?;
        apply_process_options(&options).map_err(|e| Error::new(format!("{EP_NAME}: {e}")))?;
        let tracer = options.trace.clone().map(crate::trace::Tracer::new);
        Ok(Box::new(Ep {
            table: OrtEp {
                ort_version_supported: TABLE_VERSION,
                GetName: Some(get_name),
                GetCapability: Some(get_capability),
                Compile: Some(compile),
                ReleaseNodeComputeInfos: Some(release_node_compute_infos),
                GetPreferredDataLayout: None,
                ShouldConvertDataLayoutForOp: None,
                SetDynamicOptions: None,
                OnRunStart: None,
                OnRunEnd: None,
                CreateAllocator: None,
                CreateSyncStreamForDevice: None,
                GetCompiledModelCompatibilityInfo: Some(compatibility_info),
                GetKernelRegistry: None,
                IsConcurrentRunSupported: Some(concurrent_run_supported),
            },
            stats: Arc::new(SessionStats::new(tracer, options.verbose)),
            options,
        }))
    }
}

/// Every configuration entry of the session (ORT's own and the `ep.mlxexecutionprovider.*`
/// provider options).
fn session_entries(session_options: *const OrtSessionOptions) -> Result<Vec<(String, String)>> {
    if session_options.is_null() {
        return Ok(Vec::new());
    }
    let mut kvps: *mut OrtKeyValuePairs = std::ptr::null_mut();
    ort_call!(GetSessionOptionsConfigEntries(session_options, &mut kvps))?;
    if kvps.is_null() {
        return Ok(Vec::new());
    }
    let api = super::api();
    let (mut keys, mut values, mut count) = (std::ptr::null(), std::ptr::null(), 0usize);
    // SAFETY: `kvps` is a valid set ORT created for us; the arrays hold `count` strings owned
    // by it, copied out before it is released (once).
    unsafe {
        (api.GetKeyValuePairs)(kvps, &mut keys, &mut values, &mut count);
        let mut out = Vec::with_capacity(count);
        if count > 0 && !keys.is_null() && !values.is_null() {
            let (keys, values) = (std::slice::from_raw_parts(keys, count), std::slice::from_raw_parts(values, count));
            for (&k, &v) in keys.iter().zip(values) {
                out.push((super::c_str(k), super::c_str(v)));
            }
        }
        (api.ReleaseKeyValuePairs)(kvps);
        Ok(out)
    }
}

/// The process-wide settings a session asks for: MLX's device and TF32 mode (settled by the
/// first session, an error when a later one contradicts them) and the memory limits.
fn apply_process_options(options: &Options) -> Result<()> {
    crate::mlx::device::settle(options.device, options.tf32)?;
    crate::mlx::device::settle_kernel_cache(options.kernel_cache.as_deref())?;
    if let Some(limit) = options.memory_limit {
        crate::mlx::device::set_memory_limit(usize::try_from(limit).unwrap_or(usize::MAX))?;
    }
    // The default cache limit is applied by the first session only, so it never undoes a
    // limit an earlier session gave explicitly.
    static DEFAULT_CACHE_LIMIT: std::sync::Once = std::sync::Once::new();
    if let Some(limit) = options.cache_limit {
        let set = || crate::mlx::device::set_cache_limit(usize::try_from(limit).unwrap_or(usize::MAX)).map(|_| ());
        if options.cache_limit_explicit {
            set()?;
        } else {
            let mut result = Ok(());
            DEFAULT_CACHE_LIMIT.call_once(|| result = set());
            result?;
        }
    }
    Ok(())
}

/// Runs of one session from several threads are supported: every partition run holds the
/// process-wide MLX lock (`mlx::lock`) from copy-in to copy-out, so MLX sees one run at a
/// time, and a plan's caches are behind their own locks.
unsafe extern "system" fn concurrent_run_supported(_this: *mut OrtEp, is_supported: *mut bool) -> OrtStatusPtr {
    guard("IsConcurrentRunSupported", || {
        non_null(is_supported, "is_supported")?;
        // SAFETY: checked non-null above; ORT passes a writable bool.
        unsafe { *is_supported = true };
        Ok(())
    })
}

unsafe extern "system" fn get_name(_this: *const OrtEp) -> *const c_char {
    super::EP_NAME_C.as_ptr()
}

unsafe extern "system" fn compatibility_info(_this: *mut OrtEp, _graph: *const OrtGraph) -> *const c_char {
    guard_value(COMPAT.as_ptr(), || COMPAT.as_ptr())
}

/// The claim decision for every node of a graph, and the partitions of claimed nodes.
pub struct Claims {
    pub nodes: Vec<NodeInfo>,
    /// `Err(reason)` for each node left to other EPs.
    pub decisions: Vec<std::result::Result<(), String>>,
    pub partitions: Vec<Vec<usize>>,
}

/// Decides which nodes the EP runs and how they are fused. Pure: no ORT calls.
pub fn claim_and_partition(nodes: Vec<NodeInfo>) -> Result<Claims> {
    let registry = registry::global()?;
    let decisions: Vec<_> = nodes.iter().map(|n| decide(registry, n)).collect();
    let part_nodes = part_nodes(&nodes, |i| decisions[i].is_ok());
    let partitions = partition(&part_nodes).map_err(Error::new)?;
    Ok(Claims { nodes, decisions, partitions })
}

fn decide(registry: &registry::Registry, node: &NodeInfo) -> std::result::Result<(), String> {
    for out in node.outputs.iter().flatten() {
        match out.elem_type {
            Some(t) if t.held_as().is_some() => {}
            other => {
                return Err(format!("output '{}' has type {other:?}, which MLX cannot hold", out.name));
            }
        }
    }
    // MLX GPUs have no float64: on a GPU device such nodes stay with ORT's CPU EP (whose float64
    // kernels are faster than MLX's CPU stream would be anyway).
    if crate::mlx::default_device_is_gpu()
        && let Some(v) = node.inputs.iter().chain(&node.outputs).flatten().find(|v| v.elem_type == Some(ElemType::F64))
    {
        return Err(format!("'{}' is float64, which MLX's GPU does not support", v.name));
    }
    let lowering = registry.claim(node).map_err(|d| d.0)?;
    if !lowering.takes_float8()
        && let Some(v) =
            node.inputs.iter().chain(&node.outputs).flatten().find(|v| {
                v.elem_type.is_some_and(|t| crate::float8::Float8::of(t).is_some() || t == ElemType::FLOAT4E2M1)
            })
    {
        return Err(format!("'{}' is float8 or float4, which this op's lowering does not take", v.name));
    }
    Ok(())
}

/// The producer edges between `nodes`, by value name.
fn part_nodes(nodes: &[NodeInfo], claimed: impl Fn(usize) -> bool) -> Vec<PartNode> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for out in n.outputs.iter().flatten() {
            producer.insert(out.name.as_str(), i);
        }
    }
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            // Implicit inputs (values a node's subgraphs use) are edges too.
            let mut producers: Vec<usize> = n
                .inputs
                .iter()
                .flatten()
                .chain(&n.implicit_inputs)
                .filter_map(|v| producer.get(v.name.as_str()).copied())
                .collect();
            producers.sort_unstable();
            producers.dedup();
            PartNode { producers, claimed: claimed(i) }
        })
        .collect()
}

unsafe extern "system" fn get_capability(
    this: *mut OrtEp,
    graph: *const OrtGraph,
    support: *mut OrtEpGraphSupportInfo,
) -> OrtStatusPtr {
    guard("GetCapability", || {
        non_null(this, "ep")?;
        non_null(graph, "graph")?;
        non_null(support, "graph_support_info")?;
        // SAFETY: `this` is our EP.
        let ep = unsafe { &*this.cast::<Ep>() };
        // ORT offers a subgraph (an If branch, a Loop body) before the node that owns it. When
        // the EP will take that node whole, its subgraph is left untouched here.
        let mut parent: *const OrtNode = std::ptr::null();
        ort_call!(Graph_GetParentNode(graph, &mut parent))?;
        if !parent.is_null() {
            let owner = read_node(parent)?;
            if decide(registry::global()?, &owner).is_ok() {
                if ep.options.claim_debug {
                    eprintln!(
                        "[{EP_NAME}] subgraph of node '{}' ({}) is left to that node",
                        owner.name,
                        owner.qualified_op()
                    );
                }
                return Ok(());
            }
        }
        let raw = graph_nodes(graph)?;
        let nodes = raw.iter().map(|&n| read_node(n)).collect::<Result<Vec<_>>>()?;
        let claims = claim_and_partition(nodes)?;
        if ep.options.claim_debug {
            report_claims(&claims);
        }
        let claimed_ops: Vec<String> = claims
            .nodes
            .iter()
            .zip(&claims.decisions)
            .filter(|(_, d)| d.is_ok())
            .map(|(n, _)| n.qualified_op())
            .collect();
        let sizes: Vec<usize> = claims.partitions.iter().map(Vec::len).collect();
        ep.stats.record_claims(claims.nodes.len(), &claimed_ops, &sizes);
        let options = OrtNodeFusionOptions { ort_version_supported: TABLE_VERSION, drop_constant_initializers: true };
        for group in &claims.partitions {
            let members: Vec<*const OrtNode> = group.iter().map(|&i| raw[i]).collect();
            // SAFETY: node pointers come from this graph; ORT copies the list.
            let status = unsafe {
                (ep_api().EpGraphSupportInfo_AddNodesToFuse)(support, members.as_ptr(), members.len(), &options)
            };
            check_status(status, "EpGraphSupportInfo_AddNodesToFuse")?;
        }
        Ok(())
    })
}

fn report_claims(claims: &Claims) {
    for (node, decision) in claims.nodes.iter().zip(&claims.decisions) {
        if let Err(reason) = decision {
            eprintln!(
                "[{EP_NAME}] not claimed: node '{}' ({} opset {}): {reason}",
                node.name,
                node.qualified_op(),
                node.since_version
            );
        }
    }
    let claimed = claims.decisions.iter().filter(|d| d.is_ok()).count();
    let sizes: Vec<usize> = claims.partitions.iter().map(Vec::len).collect();
    eprintln!(
        "[{EP_NAME}] claimed {claimed} of {} nodes in {} partition(s) of sizes {sizes:?}",
        claims.nodes.len(),
        sizes.len()
    );
}

unsafe extern "system" fn compile(
    this: *mut OrtEp,
    graphs: *const *const OrtGraph,
    fused_nodes: *const *const OrtNode,
    count: usize,
    node_compute_infos: *mut *mut OrtNodeComputeInfo,
    _ep_context_nodes: *mut *mut OrtNode,
) -> OrtStatusPtr {
    guard("Compile", || {
        if count == 0 {
            return Ok(());
        }
        non_null(this, "ep")?;
        non_null(graphs, "graphs")?;
        non_null(fused_nodes, "fused_nodes")?;
        // SAFETY: `this` is our EP.
        let ep = unsafe { &*this.cast::<Ep>() };
        non_null(node_compute_infos, "node_compute_infos")?;
        // SAFETY: ORT passes `count` graphs, fused nodes and output slots.
        let (graphs, fused) =
            unsafe { (std::slice::from_raw_parts(graphs, count), std::slice::from_raw_parts(fused_nodes, count)) };
        let mut built: Vec<Box<ComputeInfo>> = Vec::with_capacity(count);
        for (&graph, &fused_node) in graphs.iter().zip(fused) {
            built.push(ComputeInfo::new(build_plan(ep, graph, fused_node)?, ep.options.zero_copy));
        }
        for (i, info) in built.into_iter().enumerate() {
            // SAFETY: slot `i` exists; ORT releases it through `release_node_compute_infos`.
            unsafe { *node_compute_infos.add(i) = Box::into_raw(info).cast::<OrtNodeComputeInfo>() };
        }
        Ok(())
    })
}

/// Builds the plan for one fused node from the partition's graph.
fn build_plan(ep: &Ep, graph: *const OrtGraph, fused_node: *const OrtNode) -> Result<Plan> {
    let name = graph_reader::node_name(fused_node)?;
    let runtime_inputs: Vec<String> = node_inputs(fused_node)?
        .into_iter()
        .map(|v| graph_reader::read_value_info(v).map(|v| v.name))
        .collect::<Result<_>>()?;
    let mut outputs = Vec::new();
    for v in node_outputs(fused_node)? {
        let v = graph_reader::read_value_info(v)?;
        let t = v.elem_type.ok_or_else(|| Error::new(format!("partition output '{}' is not a tensor", v.name)))?;
        outputs.push((v.name, t));
    }

    let raw = graph_nodes(graph)?;
    let nodes = raw.iter().map(|&n| read_node(n)).collect::<Result<Vec<_>>>()?;
    let order = topological_order(&part_nodes(&nodes, |_| true)).map_err(Error::new)?;

    // Constant initializers the partition reads are uploaded to MLX once, here.
    let runtime: HashSet<&str> = runtime_inputs.iter().map(String::as_str).collect();
    let produced: HashSet<&str> =
        nodes.iter().flat_map(|n| n.outputs.iter().flatten().map(|v| v.name.as_str())).collect();
    let mut constants = HashMap::new();
    for (&node, info) in raw.iter().zip(&nodes) {
        let mut values: Vec<*const OrtValueInfo> = node_inputs(node)?;
        values.extend(graph_reader::node_implicit_inputs(node)?);
        let descs = info.inputs.iter().map(Option::as_ref).chain(info.implicit_inputs.iter().map(Some));
        for (v, desc) in values.into_iter().zip(descs) {
            let Some(desc) = desc else { continue };
            let name = desc.name.as_str();
            if runtime.contains(name) || produced.contains(name) || constants.contains_key(name) {
                continue;
            }
            if !desc.is_constant {
                return Err(Error::new(format!("value '{name}' is neither an input nor a constant of the partition"))
                    .at_node(&info.name, &info.qualified_op()));
            }
            constants.insert(name.to_owned(), graph_reader::initializer_array(v, name)?);
        }
    }

    let mut nodes: Vec<Option<NodeInfo>> = nodes.into_iter().map(Some).collect();
    let ordered = order.into_iter().map(|i| nodes[i].take().expect("each node once")).collect();
    Plan::new(
        name,
        ordered,
        runtime_inputs,
        outputs,
        constants,
        registry::global()?,
        Arc::clone(&ep.stats),
        ep.options.compile,
    )
    .map(|plan| {
        plan.with_cache_capacity(ep.options.compiled_cache).with_fusion(crate::mlx::device::fusion_for(ep.options.fuse))
    })
}

unsafe extern "system" fn release_node_compute_infos(
    _this: *mut OrtEp,
    infos: *mut *mut OrtNodeComputeInfo,
    count: usize,
) {
    guard_value((), || {
        if infos.is_null() {
            return;
        }
        // SAFETY: ORT hands back the `count` infos `compile` created.
        for &info in unsafe { std::slice::from_raw_parts(infos, count) } {
            if !info.is_null() {
                // SAFETY: ORT passes `count` compute-info pointers that this EP created.
                drop(unsafe { Box::from_raw(info.cast::<ComputeInfo>()) });
            }
        }
    })
}
