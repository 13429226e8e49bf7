//! What the lowerings with subgraphs check of them when claiming.

use ep_core::graph::Subgraph;
use ep_core::{Decline, registry};

/// Declines unless every node of `graph` can be lowered (a node with subgraphs checks its
/// own in its claim) and every value its nodes read or write, and every output, has a type
/// MLX holds as it is (a subgraph's float8 or packed sub-byte values are left to ORT: its
/// constants are read without unpacking); `what` names the graph.
pub fn check_body(graph: &Subgraph, what: &str) -> Result<(), Decline> {
    let registry = registry::global().map_err(|e| Decline(e.to_string()))?;
    for node in &graph.nodes {
        registry
            .claim(node)
            .map_err(|d| Decline(format!("{what}: node '{}' ({}): {d}", node.name, node.qualified_op())))?;
        if let Some(v) = node
            .inputs
            .iter()
            .chain(&node.outputs)
            .flatten()
            .find(|v| v.elem_type.is_some_and(|t| t.to_mlx().is_none()))
        {
            return Err(Decline(format!(
                "{what}: node '{}' ({}): '{}' has type {:?}, which a subgraph does not hold",
                node.name,
                node.qualified_op(),
                v.name,
                v.elem_type
            )));
        }
    }
    for out in &graph.outputs {
        if out.elem_type.is_none_or(|t| t.to_mlx().is_none()) {
            return Err(Decline(format!("{what} output '{}' has type {:?}", out.name, out.elem_type)));
        }
    }
    Ok(())
}
