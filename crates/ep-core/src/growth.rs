//! The decode slot's question to a lowering: when some inputs of a node grow from run to run
//! (a KV cache's length, an attention mask's), how do its outputs grow, or must the slot be
//! refused? The engine asks every lowering through [`crate::Lowering::growth`] and names no
//! op itself; the answers here are the building blocks op crates use.

use crate::graph::NodeInfo;

/// What a value carries that grows from run to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// The value's dimensions at these axes grow.
    Axes(Vec<usize>),
    /// The value holds sizes of a growing dimension (a `Shape` of a growing tensor), which a
    /// trace would bake in as constants.
    Size,
}

/// The answer: per node output, how it grows (`None`: it does not); `Err` refuses the decode
/// slot for the partition, saying why (the engine prefixes the node).
pub type GrowthResult = Result<Vec<Option<Growth>>, String>;

/// The question, for one node.
pub struct GrowthQuery<'a> {
    pub node: &'a NodeInfo,
    /// Per node input: how it grows (`None`: it does not).
    pub inputs: &'a [Option<Growth>],
    pub(crate) constants: &'a dyn Fn(usize) -> Option<Vec<i64>>,
}

impl GrowthQuery<'_> {
    /// The inputs that grow, with their index.
    pub fn growing(&self) -> impl Iterator<Item = (usize, &Growth)> {
        self.inputs.iter().enumerate().filter_map(|(i, g)| g.as_ref().map(|g| (i, g)))
    }

    /// The values of integer input `i` when it is a constant of the partition.
    pub fn constant_i64(&self, i: usize) -> Option<Vec<i64>> {
        (self.constants)(i)
    }

    /// The same growth for every output.
    pub fn all_outputs(&self, g: Option<Growth>) -> Vec<Option<Growth>> {
        vec![g; self.node.outputs.len()]
    }
}

/// The default answer of a lowering: a shapeless one (`CompileSafety::Shapeless`, an
/// elementwise-style lowering) passes the growing axes of its inputs on to every output;
/// anything else, and any input holding sizes, refuses.
pub fn by_safety(shapeless: bool, q: &GrowthQuery<'_>) -> GrowthResult {
    let sizes = q.growing().filter(|(_, g)| **g == Growth::Size).count();
    if sizes > 0 {
        return Err(if sizes == q.growing().count() {
            "reads the size of a growing dimension as a value".into()
        } else {
            "mixes growing sizes and growing tensors".into()
        });
    }
    if !shapeless {
        return Err("reads a growing dimension and declares no shape-agnostic form".into());
    }
    let mut axes: Vec<usize> = Vec::new();
    for (_, g) in q.growing() {
        if let Growth::Axes(a) = g {
            axes.extend(a);
        }
    }
    axes.sort_unstable();
    axes.dedup();
    Ok(q.all_outputs(Some(Growth::Axes(axes))))
}

/// For ops that carry sizes through unchanged (a Gather, Cast, Squeeze, Unsqueeze, Reshape or
/// Identity of a shape): when every growing input holds sizes, so does every output; growing
/// tensors get the answer of [`by_safety`].
pub fn carries_sizes(shapeless: bool, q: &GrowthQuery<'_>) -> GrowthResult {
    if q.growing().count() > 0 && q.growing().all(|(_, g)| *g == Growth::Size) {
        return Ok(q.all_outputs(Some(Growth::Size)));
    }
    by_safety(shapeless, q)
}

/// A `Shape`: the shape of a growing tensor holds a growing size.
pub fn to_size(q: &GrowthQuery<'_>) -> GrowthResult {
    if q.growing().any(|(_, g)| *g == Growth::Size) {
        return Err("reads the size of a growing dimension as a value".into());
    }
    Ok(q.all_outputs(Some(Growth::Size)))
}

/// A reduction of input 0 over `axes` (negative counting from the end of a rank-`rank`
/// input) absorbs growing axes it covers entirely (its count is evaluated when the graph
/// runs, not when it is traced); it refuses any other growing input.
pub fn reduction(q: &GrowthQuery<'_>, axes: &[i64], rank: usize) -> GrowthResult {
    let reduced: Vec<usize> = axes.iter().map(|&a| if a < 0 { a + rank as i64 } else { a } as usize).collect();
    let covered =
        q.growing().all(|(i, g)| i == 0 && matches!(g, Growth::Axes(a) if a.iter().all(|x| reduced.contains(x))));
    if axes.is_empty() || !covered {
        return Err("reduces over axes other than the growing ones".into());
    }
    Ok(q.all_outputs(None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ValueInfo;

    fn node(outputs: usize) -> NodeInfo {
        let v = |n: &str| Some(ValueInfo { name: n.into(), elem_type: None, shape: None, is_constant: false });
        NodeInfo {
            name: "n".into(),
            op_type: "Op".into(),
            domain: String::new(),
            since_version: 1,
            inputs: vec![v("a"), v("b")],
            outputs: (0..outputs).map(|i| v(&format!("y{i}"))).collect(),
            attributes: Default::default(),
            implicit_inputs: vec![],
        }
    }

    fn ask<'a>(
        node: &'a NodeInfo,
        inputs: &'a [Option<Growth>],
        none: &'a dyn Fn(usize) -> Option<Vec<i64>>,
    ) -> GrowthQuery<'a> {
        GrowthQuery { node, inputs, constants: none }
    }

    #[test]
    fn shapeless_lowerings_pass_the_union_of_growing_axes_and_others_refuse() {
        let (n, none) = (node(2), |_: usize| None);
        let inputs = [Some(Growth::Axes(vec![2])), Some(Growth::Axes(vec![1, 2]))];
        let q = ask(&n, &inputs, &none);
        assert_eq!(by_safety(true, &q), Ok(vec![Some(Growth::Axes(vec![1, 2])); 2]));
        assert!(by_safety(false, &q).is_err());
        let sizes = [Some(Growth::Size), None];
        assert!(by_safety(true, &ask(&n, &sizes, &none)).is_err());
        assert_eq!(carries_sizes(false, &ask(&n, &sizes, &none)), Ok(vec![Some(Growth::Size); 2]));
        let mixed = [Some(Growth::Size), Some(Growth::Axes(vec![0]))];
        assert_eq!(carries_sizes(true, &ask(&n, &mixed, &none)), Err("mixes growing sizes and growing tensors".into()));
    }

    #[test]
    fn a_reduction_absorbs_only_the_axes_it_covers() {
        let (n, none) = (node(1), |_: usize| None);
        let inputs = [Some(Growth::Axes(vec![2])), None];
        let q = ask(&n, &inputs, &none);
        assert_eq!(reduction(&q, &[-1], 3), Ok(vec![None]));
        assert!(reduction(&q, &[1], 3).is_err());
        assert!(reduction(&q, &[], 3).is_err());
        assert_eq!(to_size(&q), Ok(vec![Some(Growth::Size)]));
    }
}
