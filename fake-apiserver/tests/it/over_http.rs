//! The fake served over HTTP ([`FakeApiServer::http_service`]): every request
//! authenticates, RBAC applies to who authenticated, and what `kubectl` asks for
//! besides objects (discovery, the `Table` form) is answered.

use bytes::Bytes;
use gpu_booking_fake_apiserver::{FakeApiServer, API_AUDIENCE};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tower::ServiceExt;

const KUBECTL_GET: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// `GET path` over HTTP with `headers`: the status code and the JSON body.
async fn get(server: &FakeApiServer, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = http::Request::get(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::new())).unwrap();
    let response = server.http_service().oneshot(request).await.unwrap();
    let code = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn every_request_over_http_authenticates() {
    let server = FakeApiServer::new();
    let pods = "/api/v1/namespaces/jhub/pods";
    let (code, body) = get(&server, pods, &[]).await;
    assert_eq!((code, body["reason"].as_str()), (401, Some("Unauthorized")));
    let (code, _) = get(&server, pods, &[("authorization", "Bearer made-up")]).await;
    assert_eq!(code, 401, "a token nobody issued");
    let (code, _) = get(&server, "/api", &[]).await;
    assert_eq!(code, 401, "discovery is not anonymous either");
    // A ServiceAccount token for another audience (the booking API's) is not the API
    // server's.
    let elsewhere =
        server.service_account_token("gpu-booking", "gpu-booking-agent", &["gpu-booking"]);
    let (code, _) = get(&server, pods, &[("authorization", &bearer(&elsewhere))]).await;
    assert_eq!(code, 401, "a token for another audience");
    let admin = server.user_token("kubernetes-admin", &["system:masters"]);
    let (code, body) = get(&server, pods, &[("authorization", &bearer(&admin))]).await;
    assert_eq!((code, body["kind"].as_str()), (200, Some("PodList")));
    let hub = server.service_account_token("jhub", "hub", &[API_AUDIENCE]);
    let (code, _) = get(&server, pods, &[("authorization", &bearer(&hub))]).await;
    assert_eq!(
        code, 200,
        "without RBAC every authenticated request is allowed"
    );
}

#[tokio::test]
async fn rbac_decides_for_whoever_authenticated() {
    let server = FakeApiServer::new();
    server.enable_rbac();
    let hub = server.service_account_token("jhub", "hub", &[API_AUDIENCE]);
    let hub = bearer(&hub);
    let (code, body) = get(&server, "/api/v1/nodes", &[("authorization", &hub)]).await;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        "nodes is forbidden: User \"system:serviceaccount:jhub:hub\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
    );
    // Discovery is for every authenticated user (the bootstrap system:discovery).
    let (code, body) = get(&server, "/api/v1", &[("authorization", &hub)]).await;
    assert_eq!(
        (code, body["kind"].as_str()),
        (200, Some("APIResourceList"))
    );
    // Impersonation needs the impersonate verb.
    let (code, body) = get(
        &server,
        "/api/v1/nodes",
        &[
            ("authorization", &hub),
            ("impersonate-user", "kubernetes-admin"),
            ("impersonate-group", "system:masters"),
        ],
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        "users \"kubernetes-admin\" is forbidden: User \"system:serviceaccount:jhub:hub\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    // An administrator may impersonate, and is then refused what the user is refused.
    let admin = bearer(&server.user_token("kubernetes-admin", &["system:masters"]));
    let (code, body) = get(
        &server,
        "/api/v1/nodes",
        &[
            ("authorization", &admin),
            ("impersonate-user", "system:serviceaccount:jhub:hub"),
        ],
    )
    .await;
    assert_eq!(code, 403, "{body}");
    let (code, _) = get(&server, "/api/v1/nodes", &[("authorization", &admin)]).await;
    assert_eq!(code, 200);
    assert_eq!(
        server.denials().len(),
        2,
        "the two refused lists are recorded"
    );
}

#[tokio::test]
async fn kubectl_gets_discovery_and_tables() {
    let server = FakeApiServer::new();
    let auth = bearer(&server.user_token("kubernetes-admin", &["system:masters"]));
    let auth = [("authorization", auth.as_str())];
    let (_, core) = get(&server, "/api/v1", &auth).await;
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for name in ["pods", "nodes", "events", "namespaces", "pods/status"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let (_, groups) = get(&server, "/apis", &auth).await;
    assert_eq!(groups["kind"], "APIGroupList");

    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "jupyter-bob"},
        "spec": {"containers": [{"name": "notebook", "image": "jupyter"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let table_of = |path: &'static str| {
        let server = server.clone();
        let auth = auth[0].1.to_owned();
        async move {
            get(
                &server,
                path,
                &[("authorization", auth.as_str()), ("accept", KUBECTL_GET)],
            )
            .await
        }
    };
    let (code, table) = table_of("/api/v1/pods").await;
    assert_eq!((code, table["kind"].as_str()), (200, Some("Table")));
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        &columns[..5],
        ["Name", "Ready", "Status", "Restarts", "Age"]
    );
    let row = &table["rows"][0];
    assert_eq!(row["cells"][0], "jupyter-bob");
    assert_eq!(row["cells"][2], "Pending");
    assert_eq!(
        row["object"]["metadata"]["namespace"], "jhub",
        "kubectl -A reads the namespace here"
    );
    let (_, one) = table_of("/api/v1/namespaces/jhub/pods/jupyter-bob").await;
    assert_eq!(
        one["rows"].as_array().map(Vec::len),
        Some(1),
        "a get is one row"
    );
    // Without the Table in Accept: the objects themselves.
    let (_, list) = get(&server, "/api/v1/pods", &auth).await;
    assert_eq!(list["kind"], "PodList");
}

#[tokio::test]
async fn a_watch_asked_for_as_tables_sends_one_row_tables() {
    let server = FakeApiServer::new();
    let auth = bearer(&server.user_token("kubernetes-admin", &["system:masters"]));
    let request = http::Request::get("/api/v1/namespaces/jhub/pods?watch=true")
        .header("authorization", auth)
        .header("accept", KUBECTL_GET)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = server.http_service().oneshot(request).await.unwrap();
    let mut body = response.into_body();
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "jupyter-bob"},
        "spec": {"containers": [{"name": "notebook", "image": "jupyter"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let frame = body.frame().await.expect("an event").unwrap();
    let event: Value = serde_json::from_slice(frame.data_ref().expect("data")).unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(
        event["object"]["kind"], "Table",
        "kubectl get -w prints its columns"
    );
    assert_eq!(event["object"]["rows"][0]["cells"][0], "jupyter-bob");
    assert_eq!(
        event["object"]["rows"][0]["object"]["metadata"]["namespace"],
        "jhub"
    );
}

#[tokio::test]
async fn watch_is_read_as_the_api_server_reads_a_boolean_parameter() {
    let server = FakeApiServer::new();
    let auth = bearer(&server.user_token("kubernetes-admin", &["system:masters"]));
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    // Python's client (KubeSpawner's reflectors) sends `watch=True`; any value but
    // `0` and `false` (any case) asks for a watch, the empty one included.
    for (n, value) in ["true", "True", "1", "yes", ""].into_iter().enumerate() {
        // Each its own pods (a watch begins with those that match).
        let request = http::Request::get(format!(
            "/api/v1/namespaces/jhub/pods?watch={value}&labelSelector=n%3D{n}"
        ))
        .header("authorization", &auth)
        .body(Full::new(Bytes::new()))
        .unwrap();
        let response = server.http_service().oneshot(request).await.unwrap();
        let name = format!("jupyter-{n}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"n": n.to_string()}},
            "spec": {"containers": [{"name": "notebook", "image": "jupyter"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let frame = response
            .into_body()
            .frame()
            .await
            .expect("an event")
            .unwrap();
        let event: Value = serde_json::from_slice(frame.data_ref().expect("data")).unwrap();
        assert_eq!(
            (
                event["type"].as_str(),
                event["object"]["metadata"]["name"].as_str()
            ),
            (Some("ADDED"), Some(name.as_str())),
            "watch={value:?} is a watch: {event}"
        );
    }
    for value in ["false", "False", "0"] {
        let path = format!("/api/v1/namespaces/jhub/pods?watch={value}");
        let (code, body) = get(&server, &path, &[("authorization", &auth)]).await;
        assert_eq!(
            (code, body["kind"].as_str()),
            (200, Some("PodList")),
            "watch={value:?} is a list"
        );
    }
}

#[tokio::test]
async fn a_watch_without_a_resource_version_begins_with_what_is_there() {
    let server = FakeApiServer::new();
    let auth = bearer(&server.user_token("kubernetes-admin", &["system:masters"]));
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let pod = |name: &str, component: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"component": component}},
            "spec": {"containers": [{"name": "notebook", "image": "jupyter"}]},
        }))
        .unwrap()
    };
    pods.create(
        &PostParams::default(),
        &pod("jupyter-bob", "singleuser-server"),
    )
    .await
    .unwrap();
    // Unset and "0" alike: a synthetic ADDED for each object that matches, then the
    // changes; an object the selector leaves out is not sent.
    for (n, (version, component, first)) in [
        ("", "singleuser-server", "jupyter-bob"),
        ("&resourceVersion=0", "singleuser-server", "jupyter-bob"),
        ("", "other", "marker-2"),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!(
            "/api/v1/namespaces/jhub/pods?watch=1{version}&labelSelector=component%3D{component}"
        );
        let request = http::Request::get(&path)
            .header("authorization", &auth)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let mut body = server
            .http_service()
            .oneshot(request)
            .await
            .unwrap()
            .into_body();
        // A change after the watch opened, that it sends too and that ends the read.
        let marker = format!("marker-{n}");
        pods.create(&PostParams::default(), &pod(&marker, component))
            .await
            .unwrap();
        let mut names = Vec::new();
        while names.last() != Some(&marker) {
            let frame = body.frame().await.expect("an event").unwrap();
            let event: Value = serde_json::from_slice(frame.data_ref().expect("data")).unwrap();
            assert_eq!(event["type"], "ADDED", "{path}: {event}");
            names.push(
                event["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        assert_eq!(
            names.first().map(String::as_str),
            Some(first),
            "{path}: {names:?}"
        );
    }
}
