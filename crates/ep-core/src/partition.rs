//! Which claimed nodes are fused into one partition.
//!
//! Nodes are visited in topological order. A claimed node joins an existing partition when
//! that keeps every partition convex (no path leaves it and re-enters it through another node)
//! and keeps the graph of fused nodes acyclic; otherwise it opens a new partition. Partitions
//! of its producers are tried first, then the others, most recent first, so independent
//! branches end up together.

use std::collections::BTreeSet;

/// A node as the partitioner sees it.
#[derive(Debug, Clone, Default)]
pub struct PartNode {
    /// Indices of the nodes whose outputs this node consumes.
    pub producers: Vec<usize>,
    pub claimed: bool,
}

/// Groups the claimed nodes into partitions; each partition lists node indices in topological
/// order. Returns an error for a graph with a cycle.
pub fn partition(nodes: &[PartNode]) -> Result<Vec<Vec<usize>>, String> {
    let order = topological_order(nodes)?;
    let mut group_of: Vec<Option<usize>> = vec![None; nodes.len()];
    // Partitions some node of which reaches this node (its upstream partitions).
    let mut reach: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nodes.len()];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // Partitions each partition directly depends on.
    let mut deps: Vec<BTreeSet<usize>> = Vec::new();

    for &n in &order {
        let mut r = BTreeSet::new();
        for &p in &nodes[n].producers {
            r.extend(reach[p].iter().copied());
            if let Some(g) = group_of[p] {
                r.insert(g);
            }
        }
        if nodes[n].claimed {
            let mut candidates: Vec<usize> = Vec::new();
            for &p in &nodes[n].producers {
                if let Some(g) = group_of[p].filter(|g| !candidates.contains(g)) {
                    candidates.push(g);
                }
            }
            let others: Vec<usize> = (0..groups.len()).rev().filter(|g| !candidates.contains(g)).collect();
            candidates.extend(others);
            let chosen = candidates.into_iter().find(|&g| {
                let reenters = nodes[n].producers.iter().any(|&p| group_of[p] != Some(g) && reach[p].contains(&g));
                let cycle = r.iter().any(|&h| h != g && depends_on(&deps, h, g));
                !reenters && !cycle
            });
            let g = match chosen {
                Some(g) => g,
                None => {
                    groups.push(Vec::new());
                    deps.push(BTreeSet::new());
                    groups.len() - 1
                }
            };
            groups[g].push(n);
            deps[g].extend(r.iter().copied().filter(|&h| h != g));
            group_of[n] = Some(g);
        }
        reach[n] = r;
    }
    Ok(groups)
}

/// Whether partition `from` depends (transitively) on partition `on`.
fn depends_on(deps: &[BTreeSet<usize>], from: usize, on: usize) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(g) = stack.pop() {
        if g == on {
            return true;
        }
        if seen.insert(g) {
            stack.extend(deps[g].iter().copied());
        }
    }
    false
}

/// Kahn's algorithm, smallest index first among ready nodes.
pub fn topological_order(nodes: &[PartNode]) -> Result<Vec<usize>, String> {
    let mut indegree = vec![0usize; nodes.len()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (n, node) in nodes.iter().enumerate() {
        let unique: BTreeSet<usize> = node.producers.iter().copied().collect();
        for p in unique {
            if p >= nodes.len() {
                return Err(format!("node {n} consumes the output of unknown node {p}"));
            }
            indegree[n] += 1;
            consumers[p].push(n);
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&n| indegree[n] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(n) = ready.pop_first() {
        order.push(n);
        for &c in &consumers[n] {
            indegree[c] -= 1;
            if indegree[c] == 0 {
                ready.insert(c);
            }
        }
    }
    if order.len() != nodes.len() { Err("the graph has a cycle".into()) } else { Ok(order) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(producers: &[usize], claimed: bool) -> PartNode {
        PartNode { producers: producers.to_vec(), claimed }
    }

    /// Every claimed node in exactly one partition, and the graph of fused partitions plus
    /// unclaimed nodes acyclic (which also implies each partition is convex).
    fn assert_valid(nodes: &[PartNode], groups: &[Vec<usize>]) {
        let mut unit = vec![usize::MAX; nodes.len()];
        for (g, members) in groups.iter().enumerate() {
            for &n in members {
                assert!(nodes[n].claimed, "unclaimed node {n} in a partition");
                assert_eq!(unit[n], usize::MAX, "node {n} in two partitions");
                unit[n] = g;
            }
        }
        let mut next = groups.len();
        for (n, node) in nodes.iter().enumerate() {
            if unit[n] == usize::MAX {
                assert!(!node.claimed, "claimed node {n} in no partition");
                unit[n] = next;
                next += 1;
            }
        }
        let mut quotient = vec![PartNode::default(); next];
        for (n, node) in nodes.iter().enumerate() {
            for &p in &node.producers {
                if unit[p] != unit[n] {
                    quotient[unit[n]].producers.push(unit[p]);
                }
            }
        }
        assert!(topological_order(&quotient).is_ok(), "fused graph has a cycle: {groups:?}");
    }

    #[test]
    fn a_chain_is_one_partition() {
        let nodes = [node(&[], true), node(&[0], true), node(&[1], true)];
        assert_eq!(partition(&nodes).unwrap(), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn an_unclaimed_node_splits_a_chain() {
        let nodes = [node(&[], true), node(&[0], false), node(&[1], true)];
        let groups = partition(&nodes).unwrap();
        assert_eq!(groups, vec![vec![0], vec![2]]);
        assert_valid(&nodes, &groups);
    }

    #[test]
    fn a_path_through_an_unclaimed_node_is_never_fused_around() {
        // 0 -> 1 (unclaimed) -> 3, 0 -> 2 -> 3: node 3 cannot join {0, 2}.
        let nodes = [node(&[], true), node(&[0], false), node(&[0], true), node(&[1, 2], true)];
        let groups = partition(&nodes).unwrap();
        assert_eq!(groups, vec![vec![0, 2], vec![3]]);
        assert_valid(&nodes, &groups);
    }

    #[test]
    fn independent_branches_share_a_partition() {
        let nodes = [node(&[], true), node(&[], true), node(&[0, 1], true)];
        assert_eq!(partition(&nodes).unwrap(), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn partitions_never_depend_on_each_other_both_ways() {
        // a(0) -> x(1, unclaimed) -> b(2);  b'(3) -> y(4, unclaimed) -> a'(5); c(6) <- a, a'; d(7) <- b, b'.
        let nodes = [
            node(&[], true),
            node(&[0], false),
            node(&[1], true),
            node(&[], true),
            node(&[3], false),
            node(&[4], true),
            node(&[0, 5], true),
            node(&[2, 3], true),
        ];
        let groups = partition(&nodes).unwrap();
        assert_valid(&nodes, &groups);
    }

    #[test]
    fn random_graphs_give_valid_partitions() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..500 {
            let n = (next() % 24 + 1) as usize;
            let nodes: Vec<PartNode> = (0..n)
                .map(|i| {
                    let k = if i == 0 { 0 } else { next() % 3 };
                    let producers: Vec<usize> = (0..k).map(|_| (next() % i as u64) as usize).collect();
                    node(&producers, next() % 4 != 0)
                })
                .collect();
            let groups = partition(&nodes).unwrap();
            assert_valid(&nodes, &groups);
        }
    }

    #[test]
    fn a_cycle_is_an_error() {
        assert!(partition(&[node(&[1], true), node(&[0], true)]).is_err());
    }
}
