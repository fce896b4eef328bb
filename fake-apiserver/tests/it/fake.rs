//! The fake API server against a real `kube::Client`.

use futures::StreamExt;
use gpu_booking_fake_apiserver::{Failure, FakeApiServer, PodDeletion, Verb};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "jupyter"}},
        "spec": {"containers": [{"name": "nb", "image": "jupyter"}]}
    }))
    .unwrap()
}

fn api_error(e: kube::Error) -> kube::core::ErrorResponse {
    match e {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn pod_round_trip() {
    let server = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let created = pods
        .create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("jhub"));
    assert!(
        meta.uid.is_some() && meta.resource_version.is_some() && meta.creation_timestamp.is_some()
    );
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));

    let got = pods.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, meta.uid);

    let patched = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["x"], "1");

    let list = pods
        .list(&ListParams::default().labels("x=1"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let none = pods
        .list(&ListParams::default().labels("x!=1"))
        .await
        .unwrap();
    assert!(none.items.is_empty());

    // Unbound pods go at once.
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("a").await.unwrap().is_none());
    assert_eq!(server.count(Verb::Create, "pods"), 1);
    assert_eq!(server.count(Verb::Delete, "pods"), 1);
}

#[tokio::test]
async fn errors_are_status_objects() {
    let server = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let e = api_error(pods.get("nope").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "pods \"nope\" not found");
    let e = api_error(
        pods.delete("nope", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let e = api_error(
        pods.create(&PostParams::default(), &pod("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));

    // A stale resource version is a conflict.
    let mut stale = pods.get("a").await.unwrap();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"y": "2"}}})),
    )
    .await
    .unwrap();
    stale.metadata.labels = None;
    let e = api_error(
        pods.replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    // Injected failures answer with a Status of the right code, then stop.
    server.fail(Failure::on(Verb::Get, "pods").code(503).times(2));
    for _ in 0..2 {
        assert_eq!(api_error(pods.get("a").await.unwrap_err()).code, 503);
    }
    pods.get("a").await.unwrap();
}

#[tokio::test]
async fn watch_delivers_events_and_resumes() {
    let server = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b"))
        .await
        .unwrap();

    // From the list's version: both creations are replayed, then live changes follow.
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        match stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(p) => names.push(p.metadata.name.unwrap()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(names, ["a", "b"]);
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Deleted(p) => assert_eq!(p.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn field_selected_watch_sees_objects_leave() {
    let server = FakeApiServer::new();
    let mut p = pod("a");
    p.metadata.namespace = Some("jhub".into());
    p.spec.as_mut().unwrap().node_name = Some("n1".into());
    server.put(&p);
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let wp = WatchParams::default().fields("spec.nodeName=n1");
    let rv = server.resource_version().to_string();
    let mut stream = pods.watch(&wp, &rv).await.unwrap().boxed();
    server.modify::<Pod>(Some("jhub"), "a", |p| p["spec"]["nodeName"] = json!("n2"));
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Deleted(p) => assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n2")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn field_selectors_take_only_the_resources_field_labels() {
    let server = FakeApiServer::new();
    let mut running = pod("a");
    running.metadata.namespace = Some("jhub".into());
    server.put(&running);
    let mut done = pod("b");
    done.metadata.namespace = Some("jhub".into());
    server.put(&done);
    server.modify::<Pod>(Some("jhub"), "a", |p| {
        p["status"]["phase"] = json!("Running")
    });
    server.modify::<Pod>(Some("jhub"), "b", |p| {
        p["status"]["phase"] = json!("Succeeded")
    });
    let pods: Api<Pod> = Api::all(server.client());
    let unfinished = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let names: Vec<_> = pods
        .list(&unfinished)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["a"]);

    let e = api_error(
        pods.list(&ListParams::default().fields("foo.bar=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    assert_eq!(e.message, "field label not supported: foo.bar");
    // kube hands the refused watch back as the stream's first item.
    let wp = WatchParams::default().fields("spec.containers=x");
    let mut stream = pods.watch(&wp, "0").await.unwrap().boxed();
    let e = api_error(stream.next().await.unwrap().unwrap_err());
    assert_eq!(e.code, 400);
    assert_eq!(e.message, "field label not supported: spec.containers");
    // Nodes are cluster scoped: no `metadata.namespace`.
    let nodes: Api<Node> = Api::all(server.client());
    let e = api_error(
        nodes
            .list(&ListParams::default().fields("metadata.namespace=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.message, "field label not supported: metadata.namespace");
    assert!(nodes
        .list(&ListParams::default().fields("spec.unschedulable=false"))
        .await
        .is_ok());
}

#[tokio::test]
async fn bound_pods_wait_for_the_kubelet() {
    let server = FakeApiServer::new();
    let mut p = pod("a");
    p.metadata.namespace = Some("jhub".into());
    p.spec.as_mut().unwrap().node_name = Some("n1".into());
    server.put(&p);
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let terminating = pods.get("a").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(server.pod_gone("jhub", "a"));
    assert!(pods.get_opt("a").await.unwrap().is_none());

    // Grace period 0 removes at once, and so does the Immediate mode.
    server.put(&p);
    pods.delete("a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("a").await.unwrap().is_none());
    server.set_pod_deletion(PodDeletion::Immediate);
    server.put(&p);
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("a").await.unwrap().is_none());

    // A precondition on another uid is a conflict.
    server.put(&p);
    let e = api_error(
        pods.delete(
            "a",
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some("other".into()),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);
}

#[tokio::test]
async fn finalizers_hold_an_object() {
    let server = FakeApiServer::new();
    let leases: Api<Lease> = Api::namespaced(server.client(), "x");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "l", "finalizers": ["keep"]}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    leases.delete("l", &DeleteParams::default()).await.unwrap();
    assert!(leases
        .get("l")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    leases
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(leases.get_opt("l").await.unwrap().is_none());
}

#[tokio::test]
async fn patches_of_every_kind_and_status() {
    let server = FakeApiServer::new();
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}}}))
    .unwrap();
    server.put(&node);
    let json_patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels", "value": {"a": "1"}}
    ]))
    .unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::<()>::Json(json_patch),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap();
    let apply = PatchParams::apply("test");
    nodes
        .patch("n1", &apply, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"c": "3"}}})))
        .await
        .unwrap();
    let n = nodes.get("n1").await.unwrap();
    let labels = n.metadata.labels.unwrap();
    assert_eq!(
        (
            labels["a"].as_str(),
            labels["b"].as_str(),
            labels["c"].as_str()
        ),
        ("1", "2", "3")
    );
    // A main-resource patch cannot touch the status; the status subresource can.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"nvidia.com/gpu": "1"}}})),
        )
        .await
        .unwrap();
    let gpus = |n: Node| {
        n.status.unwrap().allocatable.unwrap()["nvidia.com/gpu"]
            .0
            .clone()
    };
    assert_eq!(gpus(nodes.get("n1").await.unwrap()), "4");
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {"nvidia.com/gpu": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(gpus(nodes.get("n1").await.unwrap()), "2");
    // An unchanged write is no change.
    let rv = server.resource_version();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(server.resource_version(), rv);
}

#[tokio::test]
async fn generate_name_and_paged_lists_through_the_runtime_watcher() {
    let server = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    for _ in 0..1200 {
        let mut p = pod("");
        p.metadata.name = None;
        p.metadata.generate_name = Some("w-".into());
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let mut stream = watcher(pods.clone(), watcher::Config::default()).boxed();
    let mut seen = 0;
    loop {
        match stream.next().await.unwrap().unwrap() {
            watcher::Event::InitApply(_) => seen += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(seen, 1200);
    // 500 per page.
    assert_eq!(server.count(Verb::List, "pods"), 3);
    pods.create(&PostParams::default(), &pod("late"))
        .await
        .unwrap();
    loop {
        if let watcher::Event::Apply(p) = stream.next().await.unwrap().unwrap() {
            assert_eq!(p.metadata.name.as_deref(), Some("late"));
            break;
        }
    }
}

#[tokio::test]
async fn wait_until_wakes_on_changes() {
    let server = FakeApiServer::new();
    let waiter = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .wait_until(|s| s.get::<Pod>(Some("jhub"), "a").is_some())
                .await;
        })
    };
    tokio::task::yield_now().await;
    let mut p = pod("a");
    p.metadata.namespace = Some("jhub".into());
    server.put(&p);
    waiter.await.unwrap();
}

/// ConfigMaps (the controller's intents) as the real server keeps them: created once
/// per name (409 AlreadyExists after), listed by label selector within their
/// namespace, deleted (404 after).
#[tokio::test]
async fn config_maps_by_label() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let server = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "gpu-booking");
    let cm = |name: &str, label: Option<&str>| -> ConfigMap {
        let labels = label.map(|v| json!({"gpu-booking.io/intent": v}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels.unwrap_or(json!({}))},
            "data": {"uid": name}
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    api.create(&pp, &cm("a", Some("copy"))).await.unwrap();
    api.create(&pp, &cm("b", Some("hub"))).await.unwrap();
    api.create(&pp, &cm("c", None)).await.unwrap();
    let again = api.create(&pp, &cm("a", Some("hub"))).await.unwrap_err();
    let status = api_error(again);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "jhub");
    other.create(&pp, &cm("d", Some("copy"))).await.unwrap();

    let names = |list: kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    };
    let selected = api
        .list(&ListParams::default().labels("gpu-booking.io/intent"))
        .await
        .unwrap();
    assert_eq!(names(selected), ["a", "b"]);
    let copies = api
        .list(&ListParams::default().labels("gpu-booking.io/intent=copy"))
        .await
        .unwrap();
    assert_eq!(names(copies), ["a"]);
    let stored = api.get("a").await.unwrap();
    assert_eq!(stored.data.unwrap()["uid"], "a", "the first create stays");

    api.delete("a", &DeleteParams::default()).await.unwrap();
    let gone = api.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(api_error(gone).code, 404);
}

/// RBAC enforced: a ServiceAccount gets what its Role grants in its namespace and a
/// 403 with the API server's words for the rest, each refusal kept.
#[tokio::test]
async fn rbac_grants_what_the_roles_say_and_refuses_the_rest() {
    let server = FakeApiServer::new();
    server.put_value(
        "roles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "pods", "namespace": "jhub"},
               "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create"]}]}),
    );
    server.put_value(
        "rolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "pods", "namespace": "jhub"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
               "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": "ops"}]}),
    );
    server.enable_rbac();
    let client = server.client_as("system:serviceaccount:ops:ctl", &["system:serviceaccounts"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "jhub");
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    pods.get("a").await.unwrap();
    let refused = api_error(
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(refused.code, 403);
    assert_eq!(refused.reason, "Forbidden");
    assert_eq!(
        refused.message,
        "pods \"a\" is forbidden: User \"system:serviceaccount:ops:ctl\" cannot patch resource \"pods\" in API group \"\" in the namespace \"jhub\""
    );
    let elsewhere: Api<Pod> = Api::namespaced(client, "other");
    assert_eq!(api_error(elsewhere.get("a").await.unwrap_err()).code, 403);
    // The cluster admin is never refused.
    Api::<Pod>::namespaced(server.client(), "jhub")
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let denials = server.denials();
    assert_eq!(denials.len(), 2);
    assert_eq!(denials[0].verb, Verb::Patch);
    assert_eq!(denials[1].namespace.as_deref(), Some("other"));
}

/// A pod's spec is immutable but for images, the active deadline and added
/// tolerations: any other change is a 422 in the API server's words.
#[tokio::test]
async fn pod_spec_changes_are_refused_as_the_api_server_refuses_them() {
    let server = FakeApiServer::new();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let refused = api_error(
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeSelector": {"gpu-booking.io/model": "a100"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(refused.code, 422);
    assert!(
        refused.message.starts_with("Pod \"a\" is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"),
        "{}",
        refused.message
    );
    let mut changed = pods.get("a").await.unwrap();
    changed.spec.as_mut().unwrap().containers[0].image = Some("jupyter:2".into());
    changed.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
    pods.replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
}

/// A ValidatingAdmissionPolicy (the chart's agent policy, in short) refuses an
/// update by the user it binds that changes more than its annotation, and lets the
/// annotation through.
#[tokio::test]
async fn validating_admission_policies_refuse_what_their_validations_do_not_hold() {
    let server = FakeApiServer::new();
    server.enable_admission();
    server.put_value(
        "validatingadmissionpolicies",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
               "metadata": {"name": "agent"},
               "spec": {
                   "failurePolicy": "Fail",
                   "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                       "operations": ["UPDATE"], "resources": ["pods"]}]},
                   "matchConditions": [{"name": "the-agent", "expression": "request.userInfo.username == 'agent'"}],
                   "variables": [
                       {"name": "labels", "expression": "has(object.metadata.labels) ? object.metadata.labels : {}"},
                       {"name": "oldLabels", "expression": "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"}],
                   "validations": [
                       {"expression": "object.spec == oldObject.spec", "message": "the agent may not change a pod's spec"},
                       {"expression": "variables.labels == variables.oldLabels"}]}}),
    );
    server.put_value(
        "validatingadmissionpolicybindings",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "agent-binding"},
               "spec": {"policyName": "agent", "validationActions": ["Deny"]}}),
    );
    Api::<Pod>::namespaced(server.client(), "jhub")
        .create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let agent: Api<Pod> = Api::namespaced(server.client_as("agent", &[]), "jhub");
    agent
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"seen": "now"}}})),
        )
        .await
        .unwrap();
    let refused = api_error(
        agent
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 422);
    assert_eq!(
        refused.message,
        "pods \"a\" is invalid: : ValidatingAdmissionPolicy 'agent' with binding 'agent-binding' denied request: failed expression: variables.labels == variables.oldLabels"
    );
    // Anyone else is not matched.
    Api::<Pod>::namespaced(server.client(), "jhub")
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await
        .unwrap();
}
