//! One webhook call as kube-apiserver makes it ("Dynamic Admission Control": Contacting
//! the webhook, Request, Response): an HTTPS POST of the AdmissionReview to the
//! service's DNS name `<service>.<namespace>.svc` (or `clientConfig.url`), the server
//! certificate verified against `caBundle`, `timeoutSeconds` enforced, and the answer
//! checked (version, kind, uid, patch type) before it is used.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use serde_json::{json, Value};

use crate::status::ApiError;

/// Seconds the API server waits when `timeoutSeconds` is not given.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// Why a call gave no usable answer: the server's `ErrCallingWebhook` (the webhook
/// could not be reached or answered nonsense), whose failurePolicy decides; the text
/// after "failed calling webhook".
pub type CallError = String;

/// A webhook's usable answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub allowed: bool,
    /// `response.status` (a `metav1.Status`), given with a refusal.
    pub status: Value,
    pub patch: Option<json_patch::Patch>,
    pub warnings: Vec<String>,
}

/// The error a refusal becomes: the webhook's status, its message prefixed with who
/// denied the request, never a code under 400 (the server's `ToStatusErr`).
pub fn refusal(webhook: &str, status: &Value) -> ApiError {
    let denied = format!("admission webhook \"{webhook}\" denied the request");
    let text = |field: &str| {
        status
            .get(field)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let message = match (text("message"), text("reason")) {
        (Some(m), _) => format!("{denied}: {m}"),
        (None, Some(r)) => format!("{denied}: {r}"),
        (None, None) => format!("{denied} without explanation"),
    };
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|&c| c >= 400)
        .unwrap_or(400);
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "code": code,
    });
    if let Some(reason) = text("reason") {
        body["reason"] = json!(reason);
    }
    if let Some(details) = status.get("details").filter(|d| !d.is_null()) {
        body["details"] = details.clone();
    }
    ApiError { code, body }
}

/// Where a call goes: the URL shown in messages, the URL used (the service's port
/// replaced by the registered address's), and the name the certificate must carry.
struct Endpoint {
    shown: String,
    used: String,
    host: String,
    resolve: Option<SocketAddr>,
}

fn endpoint(hook: &MutatingWebhook, services: &Services, timeout: u64) -> Result<Endpoint, String> {
    let config = &hook.client_config;
    if let Some(service) = &config.service {
        let port = service
            .port
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(443);
        let host = format!("{}.{}.svc", service.name, service.namespace);
        let path = service.path.as_deref().unwrap_or("");
        let shown = format!("https://{host}:{port}{path}?timeout={timeout}s");
        let addr = services
            .get(&(service.namespace.clone(), service.name.clone(), port))
            .copied()
            .ok_or_else(|| {
                format!(
                    "failed to call webhook: Post \"{shown}\": service \"{}\" not found",
                    service.name
                )
            })?;
        let used = format!("https://{host}:{}{path}?timeout={timeout}s", addr.port());
        return Ok(Endpoint {
            shown,
            used,
            host,
            resolve: Some(addr),
        });
    }
    let url = config
        .url
        .as_deref()
        .ok_or("the webhook has neither clientConfig.service nor clientConfig.url")?;
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("bad webhook URL {url:?}: {e}"))?;
    let host = parsed.host_str().unwrap_or("").to_owned();
    let sep = if parsed.query().is_some() { '&' } else { '?' };
    let with_timeout = format!("{url}{sep}timeout={timeout}s");
    Ok(Endpoint {
        shown: with_timeout.clone(),
        used: with_timeout,
        host,
        resolve: None,
    })
}

/// HTTPS clients by (CA bundle, host, address), so that a spawn storm does not build a
/// TLS configuration per pod.
#[derive(Default)]
pub struct Clients(Mutex<HashMap<ClientKey, reqwest::Client>>);

/// CA bundle, host name, and the address the host resolves to.
type ClientKey = (Vec<u8>, String, Option<SocketAddr>);

/// Registered webhook services: (namespace, name, port) to where they listen.
pub type Services = HashMap<(String, String, u16), SocketAddr>;

impl Clients {
    fn get(
        &self,
        ca: Option<&[u8]>,
        host: &str,
        resolve: Option<SocketAddr>,
    ) -> Result<reqwest::Client, String> {
        let key = (ca.unwrap_or_default().to_vec(), host.to_owned(), resolve);
        let mut clients = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = ca.filter(|ca| !ca.is_empty()) {
            // A caBundle replaces the system's roots, as it does for the API server.
            let roots = reqwest::Certificate::from_pem_bundle(ca).map_err(|e| {
                format!("could not get REST client: unable to load root certificates: {e}")
            })?;
            if roots.is_empty() {
                return Err("could not get REST client: unable to load root certificates: no certificate in caBundle".into());
            }
            builder = builder.tls_built_in_root_certs(false);
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        if let Some(addr) = resolve {
            builder = builder.resolve(host, addr);
        }
        let client = builder
            .build()
            .map_err(|e| format!("could not get REST client: {e}"))?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// An error and its causes, `a: b: c`, as Go's wrapped errors print.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// POSTs `review` to the webhook and checks the answer.
pub async fn call(
    clients: &Clients,
    services: &Services,
    hook: &MutatingWebhook,
    review: &Value,
) -> Result<Answer, CallError> {
    let timeout = hook
        .timeout_seconds
        .and_then(|t| u64::try_from(t).ok())
        .filter(|&t| t > 0)
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    let target = endpoint(hook, services, timeout)?;
    let ca = hook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.as_slice());
    let client = clients.get(ca, &target.host, target.resolve)?;
    let failed = |why: String| format!("failed to call webhook: Post \"{}\": {why}", target.shown);
    let response = client
        .post(&target.used)
        .timeout(Duration::from_secs(timeout))
        .json(review)
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Err(failed("context deadline exceeded".into())),
        Err(e) => return Err(failed(chain(&e))),
    };
    let code = response.status();
    // reqwest's timeout runs until the body is read, as the API server's context does.
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(e) if e.is_timeout() => return Err(failed("context deadline exceeded".into())),
        Err(e) => return Err(failed(chain(&e))),
    };
    if !code.is_success() {
        return Err(failed(format!(
            "the server responded with the status code {} but did not return more information",
            code.as_u16()
        )));
    }
    let invalid = |why: String| format!("received invalid webhook response: {why}");
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|e| failed(format!("the response is not JSON: {e}")))?;
    let api_version = answer
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = answer.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        )));
    }
    let Some(response) = answer.get("response").filter(|r| r.is_object()) else {
        return Err(invalid("webhook response was absent".into()));
    };
    let sent_uid = review
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let got_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got_uid != sent_uid {
        return Err(invalid(format!(
            "expected response.uid={sent_uid:?}, got {got_uid:?}"
        )));
    }
    let patch_b64 = response.get("patch").and_then(Value::as_str).unwrap_or("");
    match response.get("patchType").and_then(Value::as_str) {
        None if !patch_b64.is_empty() => {
            return Err(invalid(
                "webhook returned response.patch but not response.patchType".into(),
            ))
        }
        Some(t) if t != "JSONPatch" => {
            return Err(invalid(format!(
                "webhook returned invalid response.patchType of {t:?}"
            )))
        }
        _ => {}
    }
    let warnings = response
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let allowed = response
        .get("allowed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let status = response.get("status").cloned().unwrap_or(Value::Null);
    let patch = if allowed && !patch_b64.is_empty() {
        let undecodable =
            |why: String| format!("received undecodable patch in webhook response: {why}");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch_b64)
            .map_err(|e| undecodable(e.to_string()))?;
        Some(serde_json::from_slice(&bytes).map_err(|e| undecodable(e.to_string()))?)
    } else {
        None
    };
    Ok(Answer {
        allowed,
        status,
        patch,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_read_as_the_api_server_writes_them() {
        let e = refusal("pods.x", &json!({"code": 403, "message": "no GPU for you"}));
        assert_eq!(e.code, 403);
        assert_eq!(
            e.body["message"],
            "admission webhook \"pods.x\" denied the request: no GPU for you"
        );
        let e = refusal("pods.x", &json!({"code": 200}));
        assert_eq!(e.code, 400);
        assert_eq!(
            e.body["message"],
            "admission webhook \"pods.x\" denied the request without explanation"
        );
        let e = refusal("pods.x", &Value::Null);
        assert_eq!(e.code, 400);
    }

    #[test]
    fn unregistered_services_are_call_failures() {
        let hook: MutatingWebhook = serde_json::from_value(json!({
            "name": "h", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "wh", "namespace": "gb", "path": "/mutate"}}
        }))
        .unwrap();
        let e = endpoint(&hook, &HashMap::new(), 10).err().unwrap();
        assert_eq!(e, "failed to call webhook: Post \"https://wh.gb.svc:443/mutate?timeout=10s\": service \"wh\" not found");
    }
}
