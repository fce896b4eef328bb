//! The one error type of the crate.

use crate::pki::PkiError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Someone else wrote the same object first: read again and start over.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Config(String),
    /// The webhook configuration to patch does not exist.
    #[error("MutatingWebhookConfiguration {0} not found (is the chart installed?)")]
    MissingWebhookConfig(String),
    /// The signer refused, failed, or gave a certificate that does not fit.
    #[error("{0}")]
    Csr(String),
    #[error("no certificate from signer {signer} after {waited:?} (is the request approved? does the signer run?)")]
    Timeout {
        signer: String,
        waited: std::time::Duration,
    },
    #[error("{0}")]
    Internal(String),
}
