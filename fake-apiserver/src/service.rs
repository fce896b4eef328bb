//! HTTP in, HTTP out: a request of `kube::Client` becomes a store operation, and the
//! result the JSON the API server would answer.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{json, Value};

use crate::path::{self, ResourceKey, Target};
use crate::select::{FieldSelector, LabelSelector, Selector};
use crate::status::ApiError;
use crate::store::Write;

fn write_of(target: &Target) -> Write {
    match target.subresource {
        Some(_) => Write::Status,
        None => Write::Main,
    }
}
use crate::{RequestRecord, Shared, Verb};

pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

fn respond(code: u16, body: Vec<u8>) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn json_response(code: u16, value: &Value) -> Response<ResponseBody> {
    respond(code, serde_json::to_vec(value).unwrap_or_default())
}

pub(crate) fn error_response(e: ApiError) -> Response<ResponseBody> {
    json_response(e.code, &e.body)
}

/// `a=b&c=d`, percent-decoded (`+` is a space).
fn query_params(query: Option<&str>) -> HashMap<String, String> {
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() && s.is_char_boundary(i + 3) => {
                    match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// A boolean query parameter as the API server reads one
/// (`Convert_Slice_string_To_bool` in apimachinery's `runtime/conversion.go`): absent,
/// `0` or `false` (any case) is false, any other value, the empty one included, is
/// true. Python's client sends `watch=True`.
fn query_bool(params: &HashMap<String, String>, key: &str) -> bool {
    params
        .get(key)
        .is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

fn verb_of(method: &Method, target: &Target, params: &HashMap<String, String>) -> Option<Verb> {
    let named = target.name.is_some();
    Some(match *method {
        Method::GET if named => Verb::Get,
        Method::GET if query_bool(params, "watch") => Verb::Watch,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE if named => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        _ => return None,
    })
}

/// The selectors of a list, watch or deletecollection of `resource`; a field label
/// the resource does not support is a 400, as kube-apiserver answers it.
fn selector(
    params: &HashMap<String, String>,
    resource: &ResourceKey,
) -> Result<Selector, ApiError> {
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = params.get("fieldSelector").map_or("", String::as_str);
    let fields = FieldSelector::parse(fields, resource).map_err(ApiError::bad_request)?;
    Ok(Selector { labels, fields })
}

/// Reads a request's body; a body that cannot be read is a 400.
pub(crate) async fn read_body<B>(body: B) -> Result<Bytes, Response<ResponseBody>>
where
    B: http_body::Body,
    B::Error: std::fmt::Display,
{
    body.collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| error_response(ApiError::bad_request(format!("unreadable body: {e}"))))
}

/// Answers one request made by `user` (authenticated by the caller: the in-process
/// client's identity, or [`crate::authn`] over HTTP).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    parts: http::request::Parts,
    body: Bytes,
    user: crate::admission::UserInfo,
) -> Response<ResponseBody> {
    let path = parts.uri.path().to_owned();
    tracing::debug!(method = %parts.method, uri = %parts.uri, "fake API server request");
    if let Some(document) = crate::discovery::document(&path) {
        if parts.method != Method::GET {
            return error_response(ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                Value::Null,
            ));
        }
        if shared.rbac.load(std::sync::atomic::Ordering::SeqCst) {
            if let Err(e) = crate::rbac::authorize_path(&shared.lock(), &user, &path) {
                return error_response(e);
            }
        }
        return json_response(200, &document);
    }
    let params = query_params(parts.uri.query());
    let Some(target) = path::parse(&path) else {
        return error_response(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Value::Null,
        ));
    };
    let Some(verb) = verb_of(&parts.method, &target, &params) else {
        return error_response(ApiError::new(
            405,
            "MethodNotAllowed",
            "method not allowed",
            Value::Null,
        ));
    };
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    // Who asks: authorized, admitted and validated as that user.
    if shared.rbac.load(std::sync::atomic::Ordering::SeqCst) {
        let decision = crate::rbac::authorize(&shared.lock(), &user, verb, &target);
        if let Err(refusal) = decision {
            tracing::warn!(denied = %refusal.denial, "the fake API server refused a request (RBAC)");
            shared
                .denials
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(refusal.denial);
            // Waiters on the cluster may be waiting for a refusal too.
            shared.notify.notify_waiters();
            return error_response(refusal.error);
        }
    }
    {
        let mut store = shared.lock();
        *store
            .counts
            .entry((verb, target.resource.plural.clone()))
            .or_default() += 1;
        if let Some(log) = &mut store.log {
            log.push(RequestRecord {
                verb,
                method: parts.method.to_string(),
                path: path.clone(),
                query: parts.uri.query().unwrap_or("").to_owned(),
                plural: target.resource.plural.clone(),
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                subresource: target.subresource.clone(),
                body: serde_json::from_slice(&body).ok(),
            });
        }
        if let Some(code) =
            store.take_failure(verb, &target.resource.plural, target.name.as_deref())
        {
            drop(store);
            shared.changed();
            return error_response(ApiError::injected(code));
        }
    }
    // TokenReview: answered, never stored.
    if verb == Verb::Create && target.resource.plural == "tokenreviews" {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let tokens = shared.tokens.lock().unwrap_or_else(|e| e.into_inner());
        return json_response(201, &crate::tokenreview::review(&tokens, &request));
    }
    // A create is decoded (pod quantities canonical) and admitted (when the test
    // switched admission on) first; what comes out is what gets stored.
    let mut body = body;
    let mut warnings = Vec::new();
    if verb == Verb::Create {
        if let Ok(obj) = serde_json::from_slice::<Value>(&body) {
            let outcome = crate::admission::admit_create(
                &shared,
                &target,
                obj,
                user.clone(),
                dry_run(&params),
            )
            .await;
            warnings = outcome.warnings;
            match outcome.result {
                Ok(obj) => body = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()),
                Err(e) => {
                    shared.changed();
                    return with_warnings(error_response(e), &warnings);
                }
            }
        }
    }
    let table = crate::table::wanted(&parts.headers, &params);
    let request = Request {
        verb,
        target: &target,
        params: &params,
        content_type: &content_type,
        table,
    };
    let result = dispatch(&shared, &request, &body, user);
    shared.changed();
    let response = match result {
        Ok(response) => response,
        Err(e) => error_response(e),
    };
    with_warnings(response, &warnings)
}

/// `?dryRun=All`: the request is checked (admission included) and nothing is stored.
fn dry_run(params: &HashMap<String, String>) -> bool {
    params.get("dryRun").is_some_and(|d| d == "All")
}

/// Admission warnings as the API server sends them: one `Warning: 299 - "text"`
/// header each, duplicates dropped ("Dynamic Admission Control": Response, warnings).
fn with_warnings(
    mut response: Response<ResponseBody>,
    warnings: &[String],
) -> Response<ResponseBody> {
    let mut seen = std::collections::HashSet::new();
    for text in warnings.iter().filter(|w| !w.is_empty()) {
        if !seen.insert(text) {
            continue;
        }
        let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
        let printable: String = escaped
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if let Ok(value) =
            http::HeaderValue::from_bytes(format!("299 - \"{printable}\"").as_bytes())
        {
            response.headers_mut().append(http::header::WARNING, value);
        }
    }
    response
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// What a request asks, its body aside.
struct Request<'a> {
    verb: Verb,
    target: &'a Target,
    params: &'a HashMap<String, String>,
    content_type: &'a str,
    /// The `Table` form, when the client asked for it (`kubectl get`).
    table: Option<crate::table::Wanted>,
}

fn dispatch(
    shared: &Shared,
    request: &Request<'_>,
    body: &[u8],
    user: crate::admission::UserInfo,
) -> Result<Response<ResponseBody>, ApiError> {
    let Request {
        verb,
        target,
        params,
        content_type,
        table,
    } = *request;
    let resource = &target.resource;
    let ns = target.namespace.as_deref().unwrap_or("");
    let name = target.name.as_deref().unwrap_or("");
    let plural = resource.plural.as_str();
    let check = crate::admission::check_update(shared, target, user, dry_run(params));
    match verb {
        Verb::Get => {
            let store = shared.lock();
            let obj = crate::event_views::get(&store, resource, ns, name)
                .ok_or_else(|| ApiError::not_found(plural, name))?;
            match table {
                Some(wanted) => {
                    let rv = store.rv.to_string();
                    let now = store.now();
                    Ok(json_response(
                        200,
                        &wanted.table(resource, &[obj], json!({"resourceVersion": rv}), now),
                    ))
                }
                None => Ok(json_response(200, &obj)),
            }
        }
        Verb::List => list(shared, target, params, table),
        Verb::Watch => watch(shared, target, params, table),
        Verb::Create => {
            let obj = parse_body(body)?;
            let mut store = shared.lock();
            let created = if dry_run(params) {
                Arc::new(crate::admission::dry_run_create(
                    &mut store,
                    resource,
                    target.namespace.as_deref(),
                    obj,
                )?)
            } else {
                store.create(resource, target.namespace.as_deref(), obj)?
            };
            Ok(json_response(201, &created))
        }
        Verb::Update => {
            let obj = parse_body(body)?;
            let updated =
                shared
                    .lock()
                    .update_checked(resource, ns, name, write_of(target), obj, &check)?;
            Ok(json_response(200, &updated))
        }
        Verb::Patch => patch(shared, target, content_type, body, &check),
        Verb::Delete => {
            let options = if body.is_empty() {
                json!({})
            } else {
                parse_body(body)?
            };
            let grace = params
                .get("gracePeriodSeconds")
                .and_then(|g| g.parse().ok());
            let deleted = shared.lock().delete(resource, ns, name, &options, grace)?;
            Ok(json_response(200, &deleted))
        }
        Verb::DeleteCollection => {
            let sel = selector(params, resource)?;
            let mut store = shared.lock();
            let doomed = store.list(resource, target.namespace.as_deref(), &sel);
            let mut items = Vec::new();
            for obj in doomed {
                let ons = crate::fields::meta_str(&obj, "namespace")
                    .unwrap_or("")
                    .to_owned();
                let oname = crate::fields::meta_str(&obj, "name")
                    .unwrap_or("")
                    .to_owned();
                if let Ok(gone) = store.delete(resource, &ons, &oname, &json!({}), None) {
                    items.push((*gone).clone());
                }
            }
            Ok(json_response(
                200,
                &json!({"apiVersion": resource.api_version(), "kind": "List", "metadata": {}, "items": items}),
            ))
        }
    }
}

/// A list, in pages when `limit` is given (`continue` is the offset of the next
/// page: a fake needs no consistent snapshot across pages).
fn list(
    shared: &Shared,
    target: &Target,
    params: &HashMap<String, String>,
    table: Option<crate::table::Wanted>,
) -> Result<Response<ResponseBody>, ApiError> {
    let sel = selector(params, &target.resource)?;
    let store = shared.lock();
    let all = crate::event_views::list(&store, &target.resource, target.namespace.as_deref(), &sel);
    let start: usize = params
        .get("continue")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let limit: usize = params
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|&l| l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(all.len());
    let page = all.get(start.min(all.len())..end).unwrap_or(&[]);
    // The kind of what was stored, else the advertised one (an empty list of a
    // resource never written to is still a `PodList`).
    let kind = store
        .kinds
        .get(&target.resource)
        .cloned()
        .or_else(|| crate::discovery::kind_of(&target.resource).map(str::to_owned))
        .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
    let mut metadata = json!({"resourceVersion": store.rv.to_string()});
    if end < all.len() {
        metadata["continue"] = json!(end.to_string());
        metadata["remainingItemCount"] = json!(all.len() - end);
    }
    if let Some(wanted) = table {
        let table = wanted.table(&target.resource, page, metadata, store.now());
        return Ok(json_response(200, &table));
    }
    let mut out = serde_json::to_vec(&json!({
        "apiVersion": target.resource.api_version(),
        "kind": kind,
        "metadata": metadata,
    }))
    .unwrap_or_default();
    // Items are written one by one, not copied into one big value first.
    out.pop();
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, &**item);
    }
    out.extend_from_slice(b"]}");
    Ok(respond(200, out))
}

fn watch(
    shared: &Shared,
    target: &Target,
    params: &HashMap<String, String>,
    table: Option<crate::table::Wanted>,
) -> Result<Response<ResponseBody>, ApiError> {
    let sel = selector(params, &target.resource)?;
    let since = params.get("resourceVersion").and_then(|rv| rv.parse().ok());
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let rx = shared.lock().watch(
        target.resource.clone(),
        target.namespace.clone(),
        sel,
        since,
    );
    let rx = match rx {
        Ok(rx) => rx,
        // As the API server: the watch opens, then says why it ends.
        Err(e) => {
            let mut line =
                serde_json::to_vec(&json!({"type": "ERROR", "object": e.body})).unwrap_or_default();
            line.push(b'\n');
            return Ok(respond(200, line));
        }
    };
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    // As Tables (`kubectl get -w`): each event's object a one-row Table.
    let as_table = table.map(|wanted| {
        let clock = shared.lock().clock.clone();
        let resource = target.resource.clone();
        move |line: Bytes| table_event(&line, wanted, &resource, clock()).unwrap_or(line)
    });
    let stream = futures::stream::unfold(rx, move |mut rx| {
        let as_table = as_table.clone();
        async move {
            let next = match deadline {
                Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok().flatten(),
                None => rx.recv().await,
            };
            let next = match (next, &as_table) {
                (Some(line), Some(convert)) => Some(convert(line)),
                (next, _) => next,
            };
            next.map(|line| (Ok::<_, Infallible>(Frame::data(line)), rx))
        }
    });
    let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// A watch event line with its object as a one-row Table; `None` for an event
/// without an object of the resource (`ERROR`), which goes out as it is.
fn table_event(
    line: &[u8],
    wanted: crate::table::Wanted,
    resource: &crate::path::ResourceKey,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Bytes> {
    let mut event: Value = serde_json::from_slice(line).ok()?;
    if !matches!(
        event["type"].as_str(),
        Some("ADDED" | "MODIFIED" | "DELETED")
    ) {
        return None;
    }
    let object = Arc::new(event["object"].take());
    let metadata = json!({"resourceVersion": object["metadata"]["resourceVersion"]});
    event["object"] = wanted.table(resource, &[object], metadata, now);
    let mut out = serde_json::to_vec(&event).ok()?;
    out.push(b'\n');
    Some(Bytes::from(out))
}

fn patch(
    shared: &Shared,
    target: &Target,
    content_type: &str,
    body: &[u8],
    check: &dyn Fn(&crate::store::Store, &Value, &Value) -> Result<(), ApiError>,
) -> Result<Response<ResponseBody>, ApiError> {
    let resource = &target.resource;
    let ns = target.namespace.as_deref().unwrap_or("");
    let name = target.name.as_deref().unwrap_or("");
    let mut store = shared.lock();
    let Some(old) = store.get(resource, ns, name) else {
        if content_type.starts_with("application/apply-patch") {
            let mut obj = parse_body(body)?;
            obj["metadata"]["name"] = json!(name);
            let created = store.create(resource, target.namespace.as_deref(), obj)?;
            return Ok(json_response(201, &created));
        }
        return Err(ApiError::not_found(&resource.plural, name));
    };
    let mut new = (*old).clone();
    if content_type.starts_with("application/json-patch+json") {
        let ops: json_patch::Patch = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
        json_patch::patch(&mut new, &ops).map_err(|e| {
            ApiError::invalid(
                &resource.plural,
                name,
                format!("the JSON patch does not apply: {e}"),
            )
        })?;
    } else {
        // Merge, strategic merge and apply patches are all applied as JSON merge
        // patches (RFC 7386): lists are replaced whole.
        let patch = parse_body(body)?;
        json_patch::merge(&mut new, &patch);
    }
    if let Some(sub) = target.subresource.as_deref() {
        let _ = sub;
        let updated = store.update_checked(resource, ns, name, Write::Status, new, check)?;
        return Ok(json_response(200, &updated));
    }
    // The old status stays (a patch of the main resource cannot change it); a
    // resource version only where the patch itself named one.
    let named_rv = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|p| p.pointer("/metadata/resourceVersion").cloned());
    if named_rv.is_none() {
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    }
    let updated = store.update_checked(resource, ns, name, Write::Main, new, check)?;
    Ok(json_response(200, &updated))
}
