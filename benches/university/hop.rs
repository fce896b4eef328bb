//! A Kubernetes client whose requests the lab's fake API server serves on the lab's
//! runtime, not on the caller's: the fake answers a request inside the caller's
//! future (it is a `tower::Service`, no socket), so without the hop the controller's
//! threads would also run the API server's work (its store, its JSON, its scheduler
//! and kubelet) and the controller's CPU and heap would include them. With it the
//! component's threads do what the component does in a cluster: build requests and
//! read answers; the API server's side runs on the lab's threads, as on another
//! machine.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http;
use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::SinkExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::runtime::Handle;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Chunk = Result<Frame<Bytes>, BoxError>;

#[derive(Clone)]
pub struct Hop {
    /// The client whose requests are served where it runs (the fake's own).
    inner: kube::Client,
    /// The lab's runtime.
    lab: Handle,
}

impl tower::Service<http::Request<kube::client::Body>> for Hop {
    type Response = http::Response<StreamBody<mpsc::Receiver<Chunk>>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        let (head_tx, head_rx) = oneshot::channel();
        let (mut body_tx, body_rx) = mpsc::channel::<Chunk>(16);
        // The fake's whole answer, its body's frames included (a watch is a body
        // that goes on), is made on the lab's runtime.
        self.lab.spawn(async move {
            let response = match inner.send(request).await {
                Ok(response) => response,
                Err(e) => {
                    let _ = head_tx.send(Err(BoxError::from(e)));
                    return;
                }
            };
            let (parts, mut body) = response.into_parts();
            if head_tx.send(Ok(parts)).is_err() {
                return;
            }
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(BoxError::from);
                if body_tx.send(frame).await.is_err() {
                    return;
                }
            }
        });
        Box::pin(async move {
            let parts = head_rx.await.map_err(BoxError::from)??;
            Ok(http::Response::from_parts(parts, StreamBody::new(body_rx)))
        })
    }
}

/// A client on `inner` whose requests run on `lab`. Made inside the caller's runtime
/// (its request buffer's task lives there, as a client's does).
pub fn client(inner: kube::Client, lab: Handle) -> kube::Client {
    kube::Client::new(Hop { inner, lab }, "default")
}
