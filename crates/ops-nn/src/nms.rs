//! NonMaxSuppression (opsets 10, 11): per batch and class, the boxes in descending score order
//! (ties: the lower index first), each kept unless its IoU with a box already kept exceeds
//! `iou_threshold`, at most `max_output_boxes_per_class` of them, those with a score at or
//! below `score_threshold` (when given) left out. Output `[selected, 3]` int64 rows
//! `(batch, class, box)`, batch by batch, class by class, in selection order.
//!
//! The output's length depends on the data, so the node runs eagerly: boxes and scores are
//! read to the host once and the greedy selection is ORT's, in float32 operation for
//! operation (corner boxes `[y1, x1, y2, x2]` in either order, or `center_point_box = 1`:
//! `[x_center, y_center, width, height]`).

use ep_core::lowering::{FnLowering, require_input_type, require_inputs};
use ep_core::mlx::Array;
use ep_core::{CompileSafety, Decline, ElemType, LowerCtx, NodeInfo, Result, bail};

/// A candidate box: its score, index and four coordinates as given.
#[derive(Clone, Copy)]
struct Candidate {
    score: f32,
    index: usize,
    coords: [f32; 4],
}

impl Candidate {
    fn new(score: f32, index: usize, b: &[f32]) -> Candidate {
        Candidate { score, index, coords: [b[0], b[1], b[2], b[3]] }
    }

    /// The box's `(x_min, x_max, y_min, y_max)`: corners in either order, or (`center`)
    /// center and size.
    fn extent(&self, center: bool) -> (f32, f32, f32, f32) {
        let b = &self.coords;
        if center {
            let (w, h) = (b[2] / 2.0, b[3] / 2.0);
            return (b[0] - w, b[0] + w, b[1] - h, b[1] + h);
        }
        let order = |lhs: f32, rhs: f32| if lhs >= rhs { (rhs, lhs) } else { (lhs, rhs) };
        let ((x0, x1), (y0, y1)) = (order(b[1], b[3]), order(b[0], b[2]));
        (x0, x1, y0, y1)
    }

    /// Whether `self` overlaps `kept` by more than `threshold` (IoU), as ORT decides it, the
    /// candidate first: empty overlaps, areas or unions suppress nothing, and its `max` and
    /// `min` keep their first operand where a comparison with NaN fails.
    fn suppressed_by(&self, kept: &Candidate, threshold: f32, center: bool) -> bool {
        let max = |a: f32, b: f32| if a < b { b } else { a };
        let min = |a: f32, b: f32| if b < a { b } else { a };
        let (ax0, ax1, ay0, ay1) = self.extent(center);
        let (bx0, bx1, by0, by1) = kept.extent(center);
        let (x0, x1) = (max(ax0, bx0), min(ax1, bx1));
        if x1 <= x0 {
            return false;
        }
        let (y0, y1) = (max(ay0, by0), min(ay1, by1));
        if y1 <= y0 {
            return false;
        }
        let inter = (x1 - x0) * (y1 - y0);
        if inter <= 0.0 {
            return false;
        }
        let (area_a, area_b) = ((ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0));
        let union = area_a + area_b - inter;
        if area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
            return false;
        }
        inter / union > threshold
    }
}

/// ORT's candidate order: a binary max-heap popped until empty, built and popped as
/// libstdc++'s `priority_queue` does (ORT's Linux builds), under ORT's "less": a lower score, or an equal
/// score and a higher index. Without NaN scores that is descending score, the lower index
/// first among equals; with them, the heap's own order (a NaN compares neither way), which
/// only the same algorithm reproduces.
struct QueueOrder {
    heap: Vec<Candidate>,
}

impl QueueOrder {
    fn less(a: &Candidate, b: &Candidate) -> bool {
        a.score < b.score || (a.score == b.score && a.index > b.index)
    }

    fn new(heap: Vec<Candidate>) -> QueueOrder {
        let mut q = QueueOrder { heap };
        let len = q.heap.len();
        if len >= 2 {
            for parent in (0..=(len - 2) / 2).rev() {
                let value = q.heap[parent];
                q.adjust(parent, len, value);
            }
        }
        q
    }

    /// Fills the hole at `hole` of the first `len` entries with `value`: down to a leaf along
    /// the larger children, then back up.
    fn adjust(&mut self, mut hole: usize, len: usize, value: Candidate) {
        let top = hole;
        let mut child = hole;
        while child < len.saturating_sub(1) / 2 {
            child = 2 * (child + 1);
            if Self::less(&self.heap[child], &self.heap[child - 1]) {
                child -= 1;
            }
            self.heap[hole] = self.heap[child];
            hole = child;
        }
        if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
            child = 2 * (child + 1);
            self.heap[hole] = self.heap[child - 1];
            hole = child - 1;
        }
        while hole > top {
            let parent = (hole - 1) / 2;
            if !Self::less(&self.heap[parent], &value) {
                break;
            }
            self.heap[hole] = self.heap[parent];
            hole = parent;
        }
        self.heap[hole] = value;
    }
}

impl Iterator for QueueOrder {
    type Item = Candidate;

    fn next(&mut self) -> Option<Candidate> {
        let len = self.heap.len();
        if len == 0 {
            return None;
        }
        let top = self.heap[0];
        let last = self.heap[len - 1];
        self.heap[len - 1] = top;
        if len > 1 {
            self.adjust(0, len - 1, last);
        }
        self.heap.pop();
        Some(top)
    }
}

/// The greedy selection over `[batches, boxes, 4]` boxes and `[batches, classes, boxes]`
/// scores; rows `(batch, class, box)`.
fn select(
    boxes: &[f32],
    scores: &[f32],
    dims: (usize, usize, usize),
    max_per_class: usize,
    iou: f32,
    score_floor: Option<f32>,
    center: bool,
) -> Vec<[i64; 3]> {
    let (batches, classes, n) = dims;
    let mut rows = Vec::new();
    let mut kept: Vec<Candidate> = Vec::new();
    for b in 0..batches {
        let batch_boxes = &boxes[b * n * 4..(b + 1) * n * 4];
        for c in 0..classes {
            let class_scores = &scores[(b * classes + c) * n..(b * classes + c + 1) * n];
            let candidates: Vec<Candidate> = class_scores
                .iter()
                .enumerate()
                .filter(|(_, s)| score_floor.is_none_or(|f| **s > f))
                .map(|(i, &s)| Candidate::new(s, i, &batch_boxes[i * 4..i * 4 + 4]))
                .collect();
            kept.clear();
            for cand in QueueOrder::new(candidates) {
                if kept.len() >= max_per_class {
                    break;
                }
                if kept.iter().all(|k| !cand.suppressed_by(k, iou, center)) {
                    kept.push(cand);
                    rows.push([b as i64, c as i64, cand.index as i64]);
                }
            }
        }
    }
    rows
}

fn claim(node: &NodeInfo) -> std::result::Result<(), Decline> {
    require_inputs(node, 2, 5)?;
    for i in [0, 1, 3, 4] {
        require_input_type(node, i, &[ElemType::F32])?;
    }
    require_input_type(node, 2, &[ElemType::I64])?;
    match node.attr_int("center_point_box", 0)? {
        0 | 1 => Ok(()),
        v => Err(Decline(format!("center_point_box {v} is not 0 or 1"))),
    }
}

/// The one value of optional scalar input `i`, if present (ORT reads the first element).
fn first(ctx: &LowerCtx<'_>, i: usize) -> Result<Option<f64>> {
    if ctx.optional_input(i).is_none() {
        return Ok(None);
    }
    Ok(ctx.host_f64(i)?.first().copied())
}

fn lower(ctx: &mut LowerCtx<'_>, node: &NodeInfo) -> Result<Vec<Array>> {
    let (bs, ss) = (ctx.input(0)?.shape(), ctx.input(1)?.shape());
    if bs.len() != 3 || ss.len() != 3 {
        bail!("boxes {bs:?} and scores {ss:?} must be 3-D");
    }
    if bs[0] != ss[0] || bs[1] != ss[2] || bs[2] != 4 {
        bail!("boxes {bs:?} must be [batches, boxes, 4] and scores {ss:?} [batches, classes, boxes]");
    }
    let max_per_class = first(ctx, 2)?.unwrap_or(0.0).max(0.0) as usize;
    let iou = first(ctx, 3)?.unwrap_or(0.0) as f32;
    if !(0.0..=1.0).contains(&iou) {
        bail!("iou_threshold {iou} must lie within [0, 1]");
    }
    let score_floor = first(ctx, 4)?.map(|v| v as f32);
    if max_per_class == 0 {
        return Ok(vec![Array::from_slice::<i64>(&[], &[0, 3])?]);
    }
    let to_f32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    let (boxes, scores) = (to_f32(ctx.host_f64(0)?), to_f32(ctx.host_f64(1)?));
    let dims = (bs[0] as usize, ss[1] as usize, bs[1] as usize);
    let center = node.attr_int("center_point_box", 0)? == 1;
    let rows = select(&boxes, &scores, dims, max_per_class, iou, score_floor, center);
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Ok(vec![Array::from_slice(&flat, &[rows.len() as i64, 3])?])
}

ep_core::register_lowering!(
    NON_MAX_SUPPRESSION = FnLowering {
        domain: "",
        op: "NonMaxSuppression",
        opsets: 10..=i32::MAX,
        claim,
        lower,
        safety: CompileSafety::Never,
        growth: None,
    }
);

#[cfg(test)]
mod tests {
    use super::{Candidate, QueueOrder, select};

    #[test]
    fn overlapping_boxes_are_suppressed_in_score_order() {
        // Three corner boxes: 0 and 1 overlap heavily, 2 apart; box 1 scores highest.
        let boxes = [0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 5.0, 1.0, 6.0];
        let scores = [0.8, 0.9, 0.3];
        assert_eq!(select(&boxes, &scores, (1, 1, 3), 10, 0.5, None, false), [[0, 0, 1], [0, 0, 2]]);
        // A score floor drops box 2, a cap of one keeps the best only.
        assert_eq!(select(&boxes, &scores, (1, 1, 3), 10, 0.5, Some(0.5), false), [[0, 0, 1]]);
        assert_eq!(select(&boxes, &scores, (1, 1, 3), 1, 0.5, None, false), [[0, 0, 1]]);
        // Equal scores: the lower index first.
        assert_eq!(select(&boxes, &[0.5, 0.5, 0.5], (1, 1, 3), 10, 0.5, None, false), [[0, 0, 0], [0, 0, 2]]);
    }

    #[test]
    fn the_queue_pops_in_descending_score_then_ascending_index() {
        let scores = [0.3f32, 0.9, 0.5, 0.9, 0.1, 0.5, 0.7, 0.2, 0.9];
        let cands: Vec<Candidate> = scores.iter().enumerate().map(|(i, &s)| Candidate::new(s, i, &[0.0; 4])).collect();
        let order: Vec<usize> = QueueOrder::new(cands).map(|c| c.index).collect();
        assert_eq!(order, [1, 3, 8, 6, 2, 5, 0, 7, 4]);
    }
}

#[cfg(feature = "conformance")]
mod spec {
    use conformance_spec::strategy::*;
    use conformance_spec::{Case, DType, Values, register_spec};

    register_spec!(super::NON_MAX_SUPPRESSION, || {
        (1..=2i64, 1..=3i64, 1..=12i64, (0..=6i64, 0..=9u8, 0..3u8), any::<bool>(), opset(10..=22), seed())
            .prop_map(|(b, c, n, (max_out, iou, thresholds), center, v, seed)| {
                // Boxes within the unit square (positive sizes in the center form), scores in [0, 1).
                let case = Case::op("NonMaxSuppression", v)
                    .input_with("boxes", DType::F32, &[b, n, 4], Values::Uniform { lo: 0.0, hi: 1.0 })
                    .input_with("scores", DType::F32, &[b, c, n], Values::Uniform { lo: 0.0, hi: 1.0 });
                let case = match thresholds {
                    0 => case.constant_i64("max_output_boxes_per_class", &[max_out]),
                    1 => case.constant_i64("max_output_boxes_per_class", &[max_out]).constant(
                        "iou_threshold",
                        DType::F32,
                        &[1],
                        Values::Data(vec![iou as f64 / 10.0]),
                    ),
                    _ => case
                        .constant_i64("max_output_boxes_per_class", &[max_out])
                        .constant("iou_threshold", DType::F32, &[1], Values::Data(vec![iou as f64 / 10.0]))
                        .constant("score_threshold", DType::F32, &[1], Values::Data(vec![0.4])),
                };
                let case = if center { case.attr_int("center_point_box", 1) } else { case };
                case.output("selected_indices", DType::I64, &[-1, 3]).with_seed(seed)
            })
            .boxed()
    });
}
