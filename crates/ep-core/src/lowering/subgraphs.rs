//! Subgraphs a lowering runs (the branches of If, loop and scan bodies), node by node or as
//! a compiled closure, with their nodes' data checks and guards.

use super::{Check, Checked, LowerCtx, SubgraphCall};
use crate::graph::Subgraph;
use crate::mlx::{Array, ops};
use crate::{Error, Result};

impl LowerCtx<'_> {
    /// Runs a subgraph (a branch of If, a loop body) on `inputs`, bound to its formal inputs in
    /// order, and returns its outputs. Names the subgraph uses without defining them resolve
    /// to the enclosing scopes: this node's implicit inputs, and the values of any subgraph
    /// this one is nested in. Every node must have a registered lowering that claims it (a
    /// lowering with subgraphs checks that in its claim, with [`crate::registry::global`]).
    pub fn run_subgraph(&mut self, graph: &Subgraph, inputs: Vec<Array>) -> Result<Vec<Array>> {
        self.subgraph_where(graph, inputs, None)
    }

    /// [`Self::run_subgraph`] for a branch whose results are used only where `taken` (a
    /// boolean scalar array) is true: its nodes' data checks and guards hold wherever it is
    /// false (a
    /// branch evaluated on the device beside the other, then selected, must not fail the run
    /// on data only the branch not taken would read).
    pub fn run_branch(&mut self, graph: &Subgraph, inputs: Vec<Array>, taken: &Array) -> Result<Vec<Array>> {
        self.subgraph_where(graph, inputs, Some(taken))
    }

    fn subgraph_where(&mut self, graph: &Subgraph, inputs: Vec<Array>, taken: Option<&Array>) -> Result<Vec<Array>> {
        let engine = self.engine.ok_or_else(|| Error::new("subgraphs run only inside a partition"))?;
        let (mut checks, mut guards) = (Vec::new(), Vec::new());
        let call = SubgraphCall {
            stream: self.stream,
            cpu: self.cpu,
            tracing: self.tracing,
            shapeless: self.shapeless,
            scope: self.scope,
            checks: &mut checks,
            guards: &mut guards,
        };
        let outputs = engine.subgraph(graph, inputs, call)?;
        match taken {
            None => {
                self.checks.extend(checks);
                self.guards.extend(guards);
            }
            Some(taken) => {
                // Its checks and guards hold where the branch is not taken.
                let skipped = ops::logical_not(taken, self.stream)?;
                let gated = |c: Check| -> Result<Check> {
                    let holds = ops::logical_or(&c.holds(self.stream)?, &skipped, self.stream)?;
                    Ok(Check { what: Checked::All(holds), reason: c.reason })
                };
                let checks = checks.into_iter().map(gated).collect::<Result<Vec<_>>>()?;
                let guards = guards.into_iter().map(gated).collect::<Result<Vec<_>>>()?;
                self.checks.extend(checks);
                self.guards.extend(guards);
            }
        }
        Ok(outputs)
    }

    /// [`Self::run_subgraph`] for a lowering that runs outside compiled traces (an If whose
    /// condition is read on the host): the subgraph runs as a compiled closure over `inputs`
    /// and the enclosing values named in `outer` (the node's implicit inputs), traced once per
    /// key of their dtypes and shapes and replayed, rather than lowered node by node on every
    /// run. Inside a trace, or where the subgraph cannot be compiled (the reason is in the
    /// session summary), it runs as [`Self::run_subgraph`] runs it.
    pub fn run_subgraph_compiled(
        &mut self,
        graph: &Subgraph,
        inputs: Vec<Array>,
        outer: &[String],
    ) -> Result<Vec<Array>> {
        let (Some(engine), false) = (self.engine, self.tracing) else { return self.run_subgraph(graph, inputs) };
        let scope = self.scope;
        let values: Option<Vec<(String, Array)>> =
            outer.iter().map(|n| scope.and_then(|sc| sc.get(n)).map(|a| (n.clone(), a.clone()))).collect();
        let Some(values) = values else { return self.run_subgraph(graph, inputs) };
        let (mut checks, mut guards) = (Vec::new(), Vec::new());
        let call = SubgraphCall {
            stream: self.stream,
            cpu: self.cpu,
            tracing: false,
            shapeless: false,
            scope,
            checks: &mut checks,
            guards: &mut guards,
        };
        match engine.compiled_subgraph(graph, inputs.clone(), values, call)? {
            Some(outputs) => {
                self.checks.extend(checks);
                Ok(outputs)
            }
            None => self.run_subgraph(graph, inputs),
        }
    }
}
