//! What a lowering's claim is made of: [`Decline`] (why a node is left to another EP) and the
//! checks claims share (element types, ranks, input counts, constant inputs, axes), the
//! element-type sets, and [`check_shape`] for shapes built from data. Re-exported by
//! [`crate::lowering`], where op crates find them.

use crate::error::{Error, Result};
use crate::graph::ValueInfo;
use crate::graph::{ElemType, NodeInfo};
use std::ops::RangeInclusive;

/// Why a lowering leaves a node to another EP. Shown by `ONNXRUNTIME_EP_MLX_CLAIM_DEBUG=1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decline(pub String);

impl Decline {
    pub fn new(reason: impl Into<String>) -> Decline {
        Decline(reason.into())
    }
}

impl From<String> for Decline {
    fn from(s: String) -> Decline {
        Decline(s)
    }
}

impl std::fmt::Display for Decline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The float types MLX computes natively on every backend.
pub const FLOATS: &[ElemType] = &[ElemType::F32, ElemType::F16, ElemType::BF16];

/// Signed and unsigned integer types.
pub const INTS: &[ElemType] = &[
    ElemType::I8,
    ElemType::I16,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::U16,
    ElemType::U32,
    ElemType::U64,
];

/// Floats (float64 included: it runs on the CPU stream) and integers.
pub const NUMERIC: &[ElemType] = &[
    ElemType::F32,
    ElemType::F16,
    ElemType::BF16,
    ElemType::F64,
    ElemType::I8,
    ElemType::I16,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::U16,
    ElemType::U32,
    ElemType::U64,
];

/// Every type an MLX array holds bit for bit: the data-movement ops take any of them.
pub const ALL_TYPES: &[ElemType] = &[
    ElemType::F32,
    ElemType::F16,
    ElemType::BF16,
    ElemType::F64,
    ElemType::I8,
    ElemType::I16,
    ElemType::I32,
    ElemType::I64,
    ElemType::U8,
    ElemType::U16,
    ElemType::U32,
    ElemType::U64,
    ElemType::Bool,
];

/// Checks a shape a lowering is about to build from data (sizes read from an input, an
/// attribute): every dimension within `0..=i32::MAX` (MLX holds dimensions as 32-bit
/// integers) and the whole tensor within MLX's memory limit. Call it before doing host work
/// proportional to the shape.
pub fn check_shape(shape: &[i64], dtype: crate::mlx::Dtype) -> Result<()> {
    if let Some(d) = shape.iter().find(|&&d| !(0..=i32::MAX as i64).contains(&d)) {
        return Err(Error::new(format!("dimension {d} of shape {shape:?} is outside 0..=2^31-1")));
    }
    let bytes =
        shape.iter().try_fold(dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d as u64)).unwrap_or(u64::MAX);
    let limit = memory_limit();
    if bytes > limit {
        return Err(Error::new(format!(
            "a {dtype:?}{shape:?} tensor ({bytes} bytes) is more than MLX's memory limit of {limit} bytes"
        )));
    }
    // MLX does not survive an allocation that fails (it uses the null buffer), so what the
    // process may still allocate bounds a tensor too: half of it, leaving room for one
    // temporary of the same size (an index vector, a cast). Small tensors skip reading it.
    if bytes > HEADROOM_CHECKED_ABOVE
        && let Some((room, why)) = process_headroom()
        && bytes > room / 2
    {
        return Err(Error::new(format!(
            "a {dtype:?}{shape:?} tensor ({bytes} bytes) is more than half of what the process can \
             still allocate ({room} bytes: {why})"
        )));
    }
    Ok(())
}

/// Tensors up to this size are held to MLX's memory limit only.
const HEADROOM_CHECKED_ABOVE: u64 = 64 << 20;

/// The fewest bytes the process may still allocate by its limits, and which limit says so:
/// the address-space and data-segment limits (`RLIMIT_AS`, `RLIMIT_DATA`) less what is
/// mapped now, its cgroup's `memory.max` less its usage, and the host's available memory and
/// free swap. `None` where none of them can be read (not Linux).
pub fn process_headroom() -> Option<(u64, &'static str)> {
    let mut best: Option<(u64, &'static str)> = None;
    let mut offer = |room: Option<u64>, why: &'static str| {
        if let Some(r) = room
            && best.is_none_or(|(b, _)| r < b)
        {
            best = Some((r, why));
        }
    };
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let soft_limit = |label: &str| {
        let rest = limits.lines().find_map(|l| l.strip_prefix(label))?;
        rest.split_whitespace().next()?.parse::<u64>().ok()
    };
    let kb = |text: &str, key: &str| {
        let rest = text.lines().find_map(|l| l.strip_prefix(key))?;
        Some(rest.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
    };
    let room = |limit: Option<u64>, used: Option<u64>| Some(limit?.saturating_sub(used.unwrap_or(0)));
    offer(room(soft_limit("Max address space"), kb(&status, "VmSize:")), "address-space limit (RLIMIT_AS)");
    offer(room(soft_limit("Max data size"), kb(&status, "VmData:")), "data-segment limit (RLIMIT_DATA)");
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if let Some(path) = cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
        let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup{path}/{f}")).ok();
        let max = read("memory.max").and_then(|m| m.trim().parse::<u64>().ok());
        let current = read("memory.current").and_then(|m| m.trim().parse::<u64>().ok());
        offer(room(max, current), "cgroup memory.max");
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if let Some(available) = kb(&meminfo, "MemAvailable:") {
        offer(Some(available + kb(&meminfo, "SwapFree:").unwrap_or(0)), "the host's available memory and swap");
    }
    best
}

/// MLX's memory limit in bytes (read once), `u64::MAX` where the backend sets none.
pub fn memory_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| crate::mlx::memory_limit().ok().filter(|&l| l > 0).map_or(u64::MAX, |l| l as u64))
}

/// Declines unless integer attribute `name` (`default` when absent) is one of `allowed`.
pub fn require_attr_in(
    node: &NodeInfo,
    name: &str,
    default: i64,
    allowed: &[i64],
) -> std::result::Result<i64, Decline> {
    let v = node.attr_int(name, default)?;
    if !allowed.contains(&v) {
        return Err(Decline(format!("attribute {name} = {v}; supported: {allowed:?}")));
    }
    Ok(v)
}

/// Declines unless input `i` (if present) has one of `allowed` element types.
pub fn require_input_type(node: &NodeInfo, i: usize, allowed: &[ElemType]) -> std::result::Result<(), Decline> {
    match node.input(i) {
        None => Ok(()),
        Some(v) => match v.elem_type {
            Some(t) if allowed.contains(&t) => Ok(()),
            t => Err(Decline(format!("input '{}' has element type {t:?}; supported: {allowed:?}", v.name))),
        },
    }
}

/// Declines unless input `i` is present and a constant initializer.
pub fn require_constant(node: &NodeInfo, i: usize, what: &str) -> std::result::Result<(), Decline> {
    match node.input(i) {
        Some(v) if v.is_constant => Ok(()),
        Some(v) => Err(Decline(format!("{what} ('{}') must be a constant initializer", v.name))),
        None => Err(Decline(format!("{what} (input {i}) is missing"))),
    }
}

/// `axis` (negative counts from the end) as an index into a rank-`rank` shape.
pub fn normalize_axis(axis: i64, rank: usize) -> std::result::Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// The rank of input `i` when ORT knows it.
pub fn input_rank(node: &NodeInfo, i: usize) -> Option<usize> {
    node.input(i).and_then(ValueInfo::rank)
}

/// The element type of input `i` when known.
pub fn input_type(node: &NodeInfo, i: usize) -> Option<ElemType> {
    node.input(i).and_then(|v| v.elem_type)
}

/// Declines unless every present input and output is a tensor of one of `allowed`.
pub fn require_types(node: &NodeInfo, allowed: &[ElemType]) -> std::result::Result<(), Decline> {
    let values = node.inputs.iter().chain(node.outputs.iter()).flatten();
    for v in values {
        match v.elem_type {
            Some(t) if allowed.contains(&t) => {}
            Some(t) => {
                return Err(Decline(format!("'{}' has element type {t:?}; supported: {allowed:?}", v.name)));
            }
            None => return Err(Decline(format!("'{}' is not a tensor", v.name))),
        }
    }
    Ok(())
}

/// Declines unless input `i` is present with a known rank within `ranks`.
pub fn require_input_rank(
    node: &NodeInfo,
    i: usize,
    ranks: RangeInclusive<usize>,
) -> std::result::Result<usize, Decline> {
    let v = node.input(i).ok_or_else(|| Decline(format!("input {i} is missing")))?;
    match v.rank() {
        Some(r) if ranks.contains(&r) => Ok(r),
        Some(r) => Err(Decline(format!("input '{}' has rank {r}; supported: {ranks:?}", v.name))),
        None => Err(Decline(format!("input '{}' has an unknown rank", v.name))),
    }
}

/// Declines unless the node has between `min` and `max` inputs present.
pub fn require_inputs(node: &NodeInfo, min: usize, max: usize) -> std::result::Result<(), Decline> {
    let n = node.inputs.len();
    if n < min || n > max {
        return Err(Decline(format!("{n} inputs; expected {min}..={max}")));
    }
    for i in 0..min {
        if node.input(i).is_none() {
            return Err(Decline(format!("required input {i} is missing")));
        }
    }
    Ok(())
}
