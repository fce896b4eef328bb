//! The VRAM budget on each GPU node (seed 000: advertised before any pod asks for it,
//! or every budgeted pod stays Pending): the node's `status.capacity` and
//! `status.allocatable` carry the budget resources, in MiB, as `core`'s inventory
//! computes them (units x (memory per unit - reserve)), written with a JSON patch of
//! the `nodes/status` subresource ("Advertise Extended Resources for a Node"). The
//! cards a label selects share the plain `--gpumem-resource`; the cards of a model
//! under a resource of its own have `<gpumem-resource>-<model>` (core's
//! `admission::budget_resource`, the name the webhook writes on the model's pods), so
//! on a node with cards of several models one model's pods cannot take what another
//! model's cards hold.
//!
//! Level-triggered from the node watch: a node that registers again (a new object
//! without the resources) or whose status lost one is patched again; a budget no
//! longer due (the node lost its GPUs, or the cards of a model) is removed; a node
//! that already says the right thing is not written to. Only the leader writes; a
//! failure is retried, counted and reported as an Event on the node.

use json_patch::Patch as JsonPatch;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};

use gpu_booking_core::admission::{budget_names, plan_node_budgets};

use crate::actions::Ctx;
use crate::inventory::{node_gpus, Models, NodeInfo};

/// The status patch that makes `node` advertise what it should; empty when it does.
/// `resource` is `--gpumem-resource`. A model whose budget resource cannot be named
/// (a name too long) gets none: its pods get no budget either (the webhook's
/// start-up check, and its model is reported as not advertised).
pub fn plan(node: &NodeInfo, models: &Models, resource: &str) -> JsonPatch {
    let want = node_gpus(node, models).budgets;
    let (names, unnamed) = budget_names(resource, &want);
    let patch = plan_node_budgets(&node.gpumem_status, resource, &names);
    if !patch.0.is_empty() {
        for e in unnamed {
            tracing::warn!(node = %node.name, error = %e, "a VRAM budget is not advertised");
        }
    }
    patch
}

/// Writes `patch` to the node's status; true when it was written.
pub async fn apply(ctx: &Ctx, node: &str, patch: JsonPatch) -> bool {
    if !ctx.leadership.is_leader() {
        return false;
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let what = serde_json::to_string(&patch).unwrap_or_default();
    match api
        .patch_status(node, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(node, patch = %what, "VRAM budget advertised");
            ctx.metrics.action("advertise_gpumem", "done");
            true
        }
        Err(e) => {
            ctx.metrics.action("advertise_gpumem", "error");
            ctx.metrics.error("kubernetes");
            tracing::warn!(node, error = %e, "could not advertise the VRAM budget");
            let note = format!(
                "could not advertise the VRAM budget ({what}): {e}; pods budgeted for \
                 this node's model stay Pending until it is"
            );
            warn_node(ctx, node, "GpumemNotAdvertised", &note).await;
            false
        }
    }
}

/// A Warning Event on a node; a failure to record it is logged, not fatal.
pub async fn warn_node(ctx: &Ctx, node: &str, reason: &str, note: &str) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Inventory".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        ctx.metrics.error("kubernetes");
        tracing::warn!(node, error = %e, "could not record an event");
    }
}
