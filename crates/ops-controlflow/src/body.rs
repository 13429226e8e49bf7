//! What the lowerings with subgraphs check of them when claiming.

use ep_core::graph::Subgraph;
use ep_core::{Decline, registry};

/// Declines unless every node of `graph` can be lowered (a node with subgraphs checks its
/// own in its claim) and every output has a type MLX holds; `what` names the graph.
pub fn check_body(graph: &Subgraph, what: &str) -> Result<(), Decline> {
    let registry = registry::global().map_err(|e| Decline(e.to_string()))?;
    for node in &graph.nodes {
        registry
            .claim(node)
            .map_err(|d| Decline(format!("{what}: node '{}' ({}): {d}", node.name, node.qualified_op())))?;
    }
    for out in &graph.outputs {
        if out.elem_type.is_none_or(|t| t.to_mlx().is_none()) {
            return Err(Decline(format!("{what} output '{}' has type {:?}", out.name, out.elem_type)));
        }
    }
    Ok(())
}
