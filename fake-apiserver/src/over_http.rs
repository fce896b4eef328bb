//! The fake as a server over HTTP: [`HttpService`] is the `tower::Service` a socket
//! (a hyper server, TLS in front) hands its requests to. Unlike the in-process client
//! ([`crate::FakeApiServer::client`], trusted as the cluster admin's own
//! certificate would be), every request authenticates ([`crate::authn`]) and is then
//! authorized, admitted and answered as the user it authenticated as.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::service::{self, ResponseBody};
use crate::Shared;

/// The `tower::Service` of the fake served over HTTP ([`crate::FakeApiServer::http_service`]).
#[derive(Clone)]
pub struct HttpService {
    pub(crate) shared: Arc<Shared>,
}

impl<B> tower::Service<http::Request<B>> for HttpService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = http::Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let user = match crate::authn::authenticate(&shared, &parts.headers) {
                Ok(user) => user,
                Err(e) => return Ok(service::error_response(e)),
            };
            let body = match service::read_body(body).await {
                Ok(body) => body,
                Err(response) => return Ok(response),
            };
            Ok(service::handle(shared, parts, body, user).await)
        })
    }
}
