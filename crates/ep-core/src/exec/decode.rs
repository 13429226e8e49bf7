//! The decode slot of a shape-keyed partition: input dimensions that grow from run to run
//! (a KV cache, an attention mask), checked through the plan by asking each lowering how its
//! outputs grow, and one shapeless trace replayed across them.

use super::compiled::{Applied, CompiledCache, InputKey, Traced};
use super::translate::TraceMode;
use super::translate::Translation;
use super::{Plan, Source};
use crate::Result;
use crate::mlx::{Array, Dtype};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// The decode slot of a shape-keyed partition: which input dimensions grow from run to run
/// (they increased between two consecutive runs in which nothing shrank, or in the first
/// such pair at all: a KV cache's length, an attention mask's), and the shapeless closures
/// that replay across them.
#[derive(Default)]
pub(super) struct DecodeState {
    pub(super) last: Option<Vec<Vec<i64>>>,
    pub(super) growing: Vec<Vec<bool>>,
    /// The growing set [`Translation::decode_check`] accepted.
    pub(super) checked: Option<Vec<Vec<bool>>>,
    /// Why the slot is off for this partition.
    pub(super) refused: Option<String>,
    pub(super) cache: CompiledCache,
}

impl Translation {
    /// Whether the decode slot may replay one shapeless trace of this partition while the
    /// input dimensions marked in `growing` change: each node whose inputs grow is asked how
    /// its outputs grow ([`Lowering::growth`]), in order; a refusal names the node.
    pub(super) fn decode_check(&self, growing: &[Vec<bool>]) -> std::result::Result<(), String> {
        use crate::growth::{Growth, GrowthQuery};
        let mut values: HashMap<usize, Growth> = HashMap::new();
        let input_growth = |i: usize| -> Option<Growth> {
            let axes: Vec<usize> = growing.get(i)?.iter().enumerate().filter(|(_, g)| **g).map(|(a, _)| a).collect();
            (!axes.is_empty()).then_some(Growth::Axes(axes))
        };
        for node in &self.nodes {
            let inputs: Vec<Option<Growth>> = node
                .inputs
                .iter()
                .map(|src| match *src {
                    Source::Input(i) => input_growth(i),
                    Source::Value(v) => values.get(&v).cloned(),
                    _ => None,
                })
                .collect();
            if inputs.iter().all(Option::is_none) {
                continue;
            }
            let constants = |k: usize| -> Option<Vec<i64>> {
                let Some(Source::Constant(c)) = node.inputs.get(k).copied() else { return None };
                let a = &self.constants[c].1;
                let bytes = a.host_bytes()?;
                match a.dtype() {
                    Dtype::I64 => Some(
                        bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
                    ),
                    Dtype::I32 => Some(
                        bytes
                            .chunks_exact(4)
                            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                            .collect(),
                    ),
                    _ => None,
                }
            };
            let query = GrowthQuery { node: &node.info, inputs: &inputs, constants: &constants };
            let outputs = node
                .lowering
                .growth(&query)
                .map_err(|why| format!("node '{}' ({}) {why}", node.info.name, node.info.qualified_op()))?;
            for (slot, g) in node.outputs.iter().zip(outputs) {
                if let (Some(slot), Some(g)) = (slot, g) {
                    values.insert(*slot, g);
                }
            }
        }
        Ok(())
    }
}

impl Plan {
    /// Records this run's input shapes and returns the decode slot's key when the slot
    /// applies: some dimensions grow, the partition handles them shape-agnostically, and the
    /// slot was not refused. The key keeps every other dimension exact.
    pub(super) fn decode_key(&self, inputs: &[Array]) -> Option<InputKey> {
        let shapes: Vec<Vec<i64>> = inputs.iter().map(Array::shape).collect();
        let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        if st.growing.len() != shapes.len() {
            st.growing = shapes.iter().map(|s| vec![false; s.len()]).collect();
        }
        if let Some(last) = st.last.take()
            && last.len() == shapes.len()
            && last.iter().zip(&shapes).all(|(a, b)| a.len() == b.len())
        {
            let shrank = last.iter().zip(&shapes).any(|(a, b)| a.iter().zip(b).any(|(x, y)| y < x));
            // The first growth may come with a shrink (a prompt, then the first decode step:
            // the tokens shrink to one while the mask and the caches grow), so the first
            // step already replays the decode slot's closure; later, a shrink is a new start
            // (the next prompt) and marks nothing.
            let first = !st.growing.iter().flatten().any(|g| *g);
            if !shrank || first {
                for (i, (a, b)) in last.iter().zip(&shapes).enumerate() {
                    for (d, (x, y)) in a.iter().zip(b).enumerate() {
                        if y > x {
                            st.growing[i][d] = true;
                        }
                    }
                }
            }
        }
        st.last = Some(shapes.clone());
        if st.refused.is_some() || !st.growing.iter().flatten().any(|g| *g) {
            return None;
        }
        if st.checked.as_ref() != Some(&st.growing) {
            if let Err(reason) = self.translation.decode_check(&st.growing) {
                let reason = format!("partition {}: no decode slot: {reason}", self.translation.name);
                self.stats.record_fallback(reason.clone());
                st.refused = Some(reason);
                return None;
            }
            st.checked = Some(st.growing.clone());
        }
        let key = inputs
            .iter()
            .zip(&shapes)
            .zip(&st.growing)
            .map(|((a, shape), grows)| {
                let dims = shape.iter().zip(grows).map(|(&d, &g)| if g && d > 1 { -1 } else { d }).collect();
                (a.dtype(), dims)
            })
            .collect();
        Some(key)
    }

    pub(super) fn refuse_decode(&self, reason: String) {
        let reason = format!("partition {}: {reason}; using the shape-keyed slot", self.translation.name);
        self.stats.record_fallback(reason.clone());
        let mut st = self.decode.lock().unwrap_or_else(|p| p.into_inner());
        st.refused = Some(reason);
        st.cache.clear();
    }

    /// Runs the decode slot's shapeless closure for `key`.
    pub(super) fn run_decode(&self, inputs: &[Array], key: InputKey) -> Result<Applied> {
        let traced = self
            .decode
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cache
            .get_or_compile(key, || Traced::compile(&self.translation, &self.stats, TraceMode::Shapeless))?;
        let run = self.apply(&traced, inputs)?;
        self.stats.decode_runs.fetch_add(1, Ordering::Relaxed);
        Ok(run)
    }
}
