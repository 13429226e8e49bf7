//! The mutations that turn a valid case into a malformed one. Each is a small named function
//! that edits a [`FuzzCase`] and says what it did, or returns `None` where it does not apply
//! (no attribute to remove, no float input to poison). [`apply`] picks one by the case's RNG
//! and falls through to the next mutation that applies.
//!
//! Everything stays small in actual memory: huge sizes are written only as the *values* of
//! shape-like integer tensors, never as the shape of a tensor fed or built here.

use super::{FuzzCase, FuzzTensor, element_count, refill};
use conformance_spec::{Attr, DType};
use fastrand::Rng;

/// A mutation: edits the case, returns what it did (`None`: does not apply to this case).
pub type Mutation = fn(&mut FuzzCase, &mut Rng) -> Option<String>;

/// Every mutation, by name (the name goes into reports and failure directories), with its
/// weight in the draw. Mutations ORT itself always catches before an EP sees the case (a fed
/// type that differs from the declared one) weigh less.
pub const MUTATIONS: &[(&str, Mutation, u32)] = &[
    ("attr-removed", attr_removed, 3),
    ("attr-out-of-range", attr_out_of_range, 3),
    ("attr-wrong-type", attr_wrong_type, 2),
    ("attr-nonsense-list", attr_nonsense_list, 3),
    ("const-nonsense-list", const_nonsense_list, 3),
    ("shape-disagrees", shape_disagrees, 3),
    ("rank-0", rank_zero, 2),
    ("rank-over-6", rank_over_six, 2),
    ("size-0-dim", size_zero_dim, 3),
    ("huge-shape-value", huge_shape_value, 3),
    ("nan-inf", nan_inf, 3),
    ("index-out-of-range", index_out_of_range, 3),
    ("fed-dtype-differs", fed_dtype_differs, 1),
    ("optional-input-removed", optional_input_removed, 3),
];

/// Largest element count of a tensor a mutation builds (a few hundred KB at most).
const MAX_ELEMENTS: usize = 1 << 15;

/// Applies one mutation drawn by `rng` among those that apply to the case (by weight);
/// `false` when none applies.
pub fn apply(fc: &mut FuzzCase, rng: &mut Rng) -> bool {
    let base = rng.u64(..);
    let applicable: Vec<(usize, FuzzCase, String)> = MUTATIONS
        .iter()
        .enumerate()
        .filter_map(|(k, (_, mutation, _))| {
            let mut candidate = fc.clone();
            let detail = mutation(&mut candidate, &mut Rng::with_seed(base ^ k as u64))?;
            Some((k, candidate, detail))
        })
        .collect();
    let total: u32 = applicable.iter().map(|(k, ..)| MUTATIONS[*k].2).sum();
    if total == 0 {
        return false;
    }
    let mut ticket = rng.u32(0..total);
    for (k, candidate, detail) in applicable {
        let weight = MUTATIONS[k].2;
        if ticket < weight {
            *fc = candidate;
            fc.mutation = MUTATIONS[k].0.to_owned();
            fc.detail = detail;
            fc.hoist_special_floats();
            return true;
        }
        ticket -= weight;
    }
    false
}

/// Applies the mutation named `name` (for tests and targeted runs).
pub fn apply_named(fc: &mut FuzzCase, name: &str, rng: &mut Rng) -> bool {
    let Some((n, mutation, _)) = MUTATIONS.iter().find(|(n, ..)| *n == name) else { return false };
    match mutation(fc, rng) {
        Some(detail) => {
            fc.mutation = (*n).to_owned();
            fc.detail = detail;
            fc.hoist_special_floats();
            true
        }
        None => false,
    }
}

fn pick<T: Clone>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.usize(0..items.len())].clone()
}

/// Integers outside every sensible range.
const BAD_INTS: &[i64] = &[i64::MAX, i64::MIN, 1 << 31, (1 << 31) - 1, 1 << 40, -(1 << 40), 0, -1];
const BAD_FLOATS: &[f32] = &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 0.0, -1.0];

/// `(node, attribute)` positions whose attribute satisfies `keep`, one chosen at random.
fn attr_slot(fc: &FuzzCase, rng: &mut Rng, keep: impl Fn(&str, &Attr) -> bool) -> Option<(usize, usize)> {
    let slots: Vec<(usize, usize)> = fc
        .case
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| {
            node.attributes.iter().enumerate().filter(|(_, (k, v))| keep(k, v)).map(move |(a, _)| (n, a))
        })
        .collect();
    (!slots.is_empty()).then(|| pick(rng, &slots))
}

fn attr_mut(fc: &mut FuzzCase, (n, a): (usize, usize)) -> &mut (String, Attr) {
    &mut fc.case.nodes[n].attributes[a]
}

/// The rank the node most likely works on: the largest rank among its fed inputs.
fn main_rank(fc: &FuzzCase) -> i64 {
    fc.feeds.iter().map(|t| t.shape.len()).chain(fc.case.constants.iter().map(|c| c.shape.len())).max().unwrap_or(1)
        as i64
}

/// The positive dims of every input and constant (candidates for an axis length `d`).
fn dims(fc: &FuzzCase) -> Vec<i64> {
    let mut d: Vec<i64> = fc
        .feeds
        .iter()
        .flat_map(|t| t.shape.clone())
        .chain(fc.case.constants.iter().flat_map(|c| c.shape.clone()))
        .filter(|&d| d > 0)
        .collect();
    if d.is_empty() {
        d.push(4);
    }
    d
}

/// An attribute removed.
pub fn attr_removed(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let (n, a) = attr_slot(fc, rng, |_, _| true)?;
    let (name, value) = fc.case.nodes[n].attributes.remove(a);
    Some(format!("removed {name}={value:?} from node '{}'", fc.case.nodes[n].name))
}

/// An attribute set far out of its range (huge positive or negative, 0, -1; NaN, infinities;
/// an unknown string).
pub fn attr_out_of_range(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slot = attr_slot(fc, rng, |_, _| true)?;
    let bad_int = pick(rng, BAD_INTS);
    let bad_float = pick(rng, BAD_FLOATS);
    let (name, value) = attr_mut(fc, slot);
    let before = format!("{value:?}");
    match value {
        Attr::Int(v) => *v = bad_int,
        Attr::Float(v) => *v = bad_float,
        Attr::Str(v) => *v = pick(rng, &["bogus", "", "NOTSET "]).to_owned(),
        Attr::Ints(v) if v.is_empty() => v.push(bad_int),
        Attr::Ints(v) => {
            let i = rng.usize(0..v.len());
            v[i] = bad_int;
        }
        Attr::Floats(v) if v.is_empty() => v.push(bad_float),
        Attr::Floats(v) => {
            let i = rng.usize(0..v.len());
            v[i] = bad_float;
        }
        Attr::Strs(v) => v.push("bogus".into()),
    }
    Some(format!("{name}: {before} -> {value:?}"))
}

/// An attribute given a value of another type (int <-> float <-> string <-> ints).
pub fn attr_wrong_type(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slot = attr_slot(fc, rng, |_, _| true)?;
    let (name, value) = attr_mut(fc, slot);
    let before = format!("{value:?}");
    let choice = rng.u8(0..3);
    *value = match (&*value, choice) {
        (Attr::Int(v), 0) => Attr::Float(*v as f32),
        (Attr::Int(v), 1) => Attr::Str(v.to_string()),
        (Attr::Int(v), _) => Attr::Ints(vec![*v, *v]),
        (Attr::Float(v), 0) => Attr::Int(*v as i64),
        (Attr::Float(v), 1) => Attr::Str(v.to_string()),
        (Attr::Float(v), _) => Attr::Floats(vec![*v]),
        (Attr::Str(_), 0) => Attr::Int(1),
        (Attr::Str(_), 1) => Attr::Float(1.0),
        (Attr::Str(v), _) => Attr::Strs(vec![v.clone()]),
        (Attr::Ints(v), 0) => Attr::Int(v.first().copied().unwrap_or(1)),
        (Attr::Ints(v), 1) => Attr::Floats(v.iter().map(|&x| x as f32).collect()),
        (Attr::Ints(v), _) => Attr::Str(format!("{v:?}")),
        (Attr::Floats(v), 0) => Attr::Float(v.first().copied().unwrap_or(1.0)),
        (Attr::Floats(v), _) => Attr::Ints(v.iter().map(|&x| x as i64).collect()),
        (Attr::Strs(v), _) => Attr::Str(v.first().cloned().unwrap_or_default()),
    };
    Some(format!("{name}: {before} -> {value:?}"))
}

/// A list of axes / a permutation / pads / strides / sizes made nonsensical: a duplicate, an
/// entry past the rank (or below `-rank`), a negative or zero entry, a wrong length.
fn nonsense_list(v: &mut Vec<i64>, rank: i64, rng: &mut Rng) -> String {
    let i = if v.is_empty() { 0 } else { rng.usize(0..v.len()) };
    match rng.u8(0..7) {
        0 if !v.is_empty() => {
            v.push(v[i]);
            format!("duplicated entry {i}")
        }
        1 => {
            let bad = pick(rng, &[rank, -rank - 1, rank + 5, 64]);
            if v.is_empty() {
                v.push(bad)
            } else {
                v[i] = bad
            }
            format!("entry {i} = {bad} (rank {rank})")
        }
        2 if !v.is_empty() => {
            v[i] = v[i].saturating_abs().saturating_neg().saturating_sub(1);
            format!("entry {i} negative")
        }
        3 if !v.is_empty() => {
            v[i] = 0;
            format!("entry {i} zero")
        }
        4 if !v.is_empty() => {
            v.pop();
            "last entry dropped".into()
        }
        5 => {
            v.clear();
            "emptied".into()
        }
        _ => {
            v.push(1);
            "an entry appended".into()
        }
    }
}

/// Attributes that name axes, sizes or layouts: axis-like ints past the rank, list attributes
/// (axes, perm, pads, strides, kernel_shape, dilations, ...) made nonsensical, block sizes zero,
/// negative or not a power of two.
pub fn attr_nonsense_list(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    const AXIS_LIKE: &[&str] = &["axis", "quantize_axis", "gather_axis", "batch_dims", "k", "group", "num_groups"];
    const SIZE_LIKE: &[&str] = &["block_size", "blocksize", "bits", "num_heads", "kv_num_heads", "q_num_heads"];
    let rank = main_rank(fc);
    let slot = attr_slot(fc, rng, |k, v| {
        matches!(v, Attr::Ints(_)) || AXIS_LIKE.contains(&k) || SIZE_LIKE.contains(&k) || k.ends_with("axis")
    })?;
    let (name, value) = attr_mut(fc, slot);
    let before = format!("{value:?}");
    let what = match value {
        Attr::Ints(v) => nonsense_list(v, rank, rng),
        Attr::Int(v) if SIZE_LIKE.contains(&name.as_str()) => {
            *v = pick(rng, &[0, -1, 3, 7, 1 << 20]);
            "size-like".into()
        }
        Attr::Int(v) => {
            *v = pick(rng, &[rank, -rank - 1, rank + 5, 64]);
            format!("past rank {rank}")
        }
        _ => return None,
    };
    Some(format!("{name}: {before} -> {value:?} ({what})"))
}

/// A 1-D integer constant (axes, perm, pads, starts/ends/steps, sizes, repeats, split)
/// made nonsensical the same way, its shape following its new length.
pub fn const_nonsense_list(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let rank = main_rank(fc);
    let names: Vec<String> = fc
        .case
        .constants
        .iter()
        .filter(|c| c.dtype.is_int() && c.shape.len() == 1 && read_by_nodes(fc, &c.name))
        .map(|c| c.name.clone())
        .collect();
    if names.is_empty() {
        return None;
    }
    let name = pick(rng, &names);
    let t = fc.constant_mut(&name)?;
    let mut v: Vec<i64> = t.values.iter().map(|&x| x as i64).collect();
    let before = format!("{v:?}");
    let what = nonsense_list(&mut v, rank, rng);
    t.shape = vec![v.len() as i64];
    t.values = v.iter().map(|&x| x as f64).collect();
    Some(format!("constant {name}: {before} -> {v:?} ({what})"))
}

/// A runtime input fed at a shape that disagrees with its declaration or with the other
/// inputs (usually declared symbolic, so the mismatch reaches the EPs rather than ORT's own
/// input check).
pub fn shape_disagrees(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    if fc.feeds.is_empty() {
        return None;
    }
    let i = rng.usize(0..fc.feeds.len());
    let old = fc.feeds[i].shape.clone();
    let mut shape = old.clone();
    match rng.u8(0..4) {
        0 if !shape.is_empty() => {
            let k = rng.usize(0..shape.len());
            shape[k] = if shape[k] > 1 { shape[k] - 1 } else { shape[k] + 2 };
        }
        1 if !shape.is_empty() => {
            shape.remove(0);
        }
        2 if !shape.is_empty() => {
            let k = rng.usize(0..shape.len());
            shape[k] += 3;
        }
        _ => shape.insert(0, 2),
    }
    refeed(fc, i, &shape)?;
    fc.case.symbolic = Some(rng.u8(0..4) != 0);
    let how = if fc.case.is_symbolic() { "declared symbolic" } else { "declared static" };
    Some(format!("input {} fed as {shape:?}, declared {old:?} ({how})", fc.feeds[i].name))
}

/// Feeds input `i` at `shape` (fresh values); `None` when that would be too large.
fn refeed(fc: &mut FuzzCase, i: usize, shape: &[i64]) -> Option<()> {
    if element_count(shape) > MAX_ELEMENTS {
        return None;
    }
    let spec = &fc.case.inputs[i];
    fc.feeds[i].values = refill(spec, shape, fc.case.seed, i as u64);
    fc.feeds[i].shape = shape.to_vec();
    Some(())
}

/// Declares and feeds input `i` at `shape`.
fn reshape_input(fc: &mut FuzzCase, i: usize, shape: &[i64]) -> Option<()> {
    refeed(fc, i, shape)?;
    fc.case.inputs[i].shape = shape.to_vec();
    Some(())
}

fn input_index(fc: &FuzzCase, rng: &mut Rng, keep: impl Fn(&FuzzTensor) -> bool) -> Option<usize> {
    let idx: Vec<usize> = (0..fc.feeds.len()).filter(|&i| keep(&fc.feeds[i])).collect();
    (!idx.is_empty()).then(|| pick(rng, &idx))
}

/// A runtime input declared and fed as a scalar.
pub fn rank_zero(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let i = input_index(fc, rng, |t| !t.shape.is_empty())?;
    let old = fc.feeds[i].shape.clone();
    reshape_input(fc, i, &[])?;
    Some(format!("input {} declared and fed as a scalar (was {old:?})", fc.feeds[i].name))
}

/// A runtime input declared and fed at rank 7 or 8 (leading dims of 1 or 2, few elements).
pub fn rank_over_six(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let i = input_index(fc, rng, |t| t.shape.len() <= 6)?;
    let old = fc.feeds[i].shape.clone();
    let target = rng.usize(7..=8);
    let mut shape = old.clone();
    while shape.len() < target {
        shape.insert(0, if rng.u8(0..4) == 0 { 2 } else { 1 });
    }
    reshape_input(fc, i, &shape)?;
    Some(format!("input {} declared and fed as {shape:?} (was {old:?})", fc.feeds[i].name))
}

/// A size-0 dim in a runtime input (declared and fed).
pub fn size_zero_dim(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let i = input_index(fc, rng, |t| t.shape.iter().any(|&d| d != 0))?;
    let old = fc.feeds[i].shape.clone();
    let k = rng.usize(0..old.len());
    let mut shape = old.clone();
    shape[k] = 0;
    reshape_input(fc, i, &shape)?;
    Some(format!("input {} declared and fed as {shape:?} (was {old:?})", fc.feeds[i].name))
}

/// Where an integer tensor is: a runtime input (index into the feeds) or a constant (name).
enum Slot {
    Feed(usize),
    Constant(String),
}

/// Whether a node of the case (not only its reference graph) reads the constant `name`.
fn read_by_nodes(fc: &FuzzCase, name: &str) -> bool {
    fc.case.nodes.iter().any(|n| n.inputs.iter().any(|i| i == name))
}

/// A non-empty tensor (runtime input or constant) whose type satisfies `keep`.
fn tensor_slot(fc: &FuzzCase, rng: &mut Rng, keep: impl Fn(DType) -> bool) -> Option<Slot> {
    let mut slots: Vec<Slot> =
        (0..fc.feeds.len()).filter(|&i| keep(fc.feeds[i].dtype) && !fc.feeds[i].is_empty()).map(Slot::Feed).collect();
    slots.extend(
        fc.case
            .constants
            .iter()
            .filter(|c| keep(c.dtype) && element_count(&c.shape) > 0 && read_by_nodes(fc, &c.name))
            .map(|c| Slot::Constant(c.name.clone())),
    );
    if slots.is_empty() {
        return None;
    }
    let k = rng.usize(0..slots.len());
    Some(slots.swap_remove(k))
}

fn slot_mut<'a>(fc: &'a mut FuzzCase, slot: &Slot) -> Option<&'a mut FuzzTensor> {
    match slot {
        Slot::Feed(i) => fc.feeds.get_mut(*i),
        Slot::Constant(name) => fc.constant_mut(name),
    }
}

/// Sets one element (or, a third of the time, every element) of the tensor at `slot`.
fn set_values(fc: &mut FuzzCase, slot: &Slot, rng: &mut Rng, value: f64) -> Option<String> {
    let all = rng.u8(0..3) == 0;
    let t = slot_mut(fc, slot)?;
    let kind = if matches!(slot, Slot::Feed(_)) { "input" } else { "constant" };
    if all {
        t.values.iter_mut().for_each(|v| *v = value);
        Some(format!("every element of {kind} {} ({:?}{:?}) = {value}", t.name, t.dtype, t.shape))
    } else {
        let i = rng.usize(0..t.values.len().max(1));
        *t.values.get_mut(i)? = value;
        Some(format!("element {i} of {kind} {} ({:?}{:?}) = {value}", t.name, t.dtype, t.shape))
    }
}

/// A shape-like integer value (a target shape, repeats, sizes, pads, a depth, a range limit)
/// made huge or negative: 2^31 - 1, 2^31, 2^40, 2^62, -2. Only the value is huge.
pub fn huge_shape_value(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slot = tensor_slot(fc, rng, DType::is_int)?;
    let value =
        pick(rng, &[(1u64 << 31) as f64 - 1.0, (1u64 << 31) as f64, (1u64 << 40) as f64, (1u64 << 62) as f64, -2.0]);
    set_values(fc, &slot, rng, value)
}

/// Float values set to NaN, +inf or -inf.
pub fn nan_inf(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slot = tensor_slot(fc, rng, DType::is_float)?;
    let value = pick(rng, &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
    set_values(fc, &slot, rng, value)
}

/// An index-like integer value out of range for an axis of length `d` (a dim of one of the
/// case's tensors): `d`, `-d - 1`, 10^5, 2^40.
pub fn index_out_of_range(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slot = tensor_slot(fc, rng, DType::is_int)?;
    let d = pick(rng, &dims(fc));
    let value = pick(rng, &[d as f64, (-d - 1) as f64, 1e5, (1u64 << 40) as f64]);
    set_values(fc, &slot, rng, value).map(|s| format!("{s} (d = {d})"))
}

/// A runtime input fed with another element type than declared.
pub fn fed_dtype_differs(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let i = input_index(fc, rng, |_| true)?;
    let declared = fc.feeds[i].dtype;
    let others: Vec<DType> = [DType::F32, DType::F16, DType::F64, DType::I64, DType::I32, DType::U8, DType::Bool]
        .into_iter()
        .filter(|&d| d != declared)
        .collect();
    let fed = pick(rng, &others);
    let t = &mut fc.feeds[i];
    t.dtype = fed;
    if !fed.is_float() {
        let (lo, hi) = fed.range();
        t.values.iter_mut().for_each(|v| *v = if v.is_finite() { v.trunc().clamp(lo, hi) } else { 0.0 });
    }
    Some(format!("input {} declared {declared:?}, fed {fed:?}", t.name))
}

/// An input of a node made absent (`""` in its place, or dropped when it is the last one);
/// its graph input or constant goes too when nothing else reads it.
pub fn optional_input_removed(fc: &mut FuzzCase, rng: &mut Rng) -> Option<String> {
    let slots: Vec<(usize, usize)> = fc
        .case
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| node.inputs.iter().enumerate().filter(|(_, s)| !s.is_empty()).map(move |(k, _)| (n, k)))
        .collect();
    if slots.is_empty() {
        return None;
    }
    let (n, k) = pick(rng, &slots);
    let node = &mut fc.case.nodes[n];
    let name = std::mem::take(&mut node.inputs[k]);
    while node.inputs.last().is_some_and(|s| s.is_empty()) {
        node.inputs.pop();
    }
    let node_name = node.name.clone();
    if !fc.case.nodes.iter().any(|node| node.inputs.contains(&name)) {
        if let Some(i) = fc.case.inputs.iter().position(|t| t.name == name) {
            fc.case.inputs.remove(i);
            fc.feeds.remove(i);
        }
        fc.case.constants.retain(|c| c.name != name);
        fc.constants.retain(|c| c.name != name);
    }
    Some(format!("input {k} ({name}) of node '{node_name}' removed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use conformance_spec::Case;

    fn gather() -> FuzzCase {
        let case = Case::op("Gather", 13)
            .input("x", DType::F32, &[4, 3])
            .input("i", DType::I64, &[2])
            .attr_int("axis", 0)
            .output("y", DType::F32, &[2, 3]);
        FuzzCase::valid("Gather", case)
    }

    #[test]
    fn every_mutation_applies_to_a_gather_and_survives_json() {
        for (name, ..) in MUTATIONS {
            let mut fc = gather();
            if *name == "const-nonsense-list" {
                fc = FuzzCase::valid(
                    "Reshape",
                    Case::op("Reshape", 14).input("x", DType::F32, &[2, 3]).constant_i64("s", &[3, 2]),
                );
            }
            let mut rng = Rng::with_seed(7);
            assert!(apply_named(&mut fc, name, &mut rng), "{name} did not apply");
            assert_eq!(&fc.mutation, name);
            let back: FuzzCase = serde_json::from_str(&serde_json::to_string(&fc).unwrap()).unwrap();
            assert_eq!(back.mutation, fc.mutation);
            for t in &fc.feeds {
                assert_eq!(t.values.len(), t.len(), "{name}: {} values for shape {:?}", t.values.len(), t.shape);
            }
        }
    }

    #[test]
    fn removing_an_input_drops_its_feed() {
        let mut fc = gather();
        let mut rng = Rng::with_seed(1);
        while fc.feeds.len() == 2 {
            let mut c = gather();
            assert!(apply_named(&mut c, "optional-input-removed", &mut rng));
            fc = c;
        }
        assert_eq!(fc.case.inputs.len(), fc.feeds.len());
    }
}
