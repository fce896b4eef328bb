//! `gpu-booking certs self-signed`: the plan of [`crate::plan`] carried out on the
//! cluster, in an order that never leaves the API server distrusting what the webhook
//! serves: the CA Secret first, then the caBundle (old and new CA while they overlap),
//! and the serving Secret last.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::cluster::{Cluster, Injection, CA_CRT, TLS_CRT, TLS_KEY};
use crate::config::SelfSignedArgs;
use crate::error::Error;
use crate::plan::{self, Reason, Stored};
use crate::{inject, retry_on_conflict};

/// What one run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub ca_renewed: Option<Reason>,
    pub serving_renewed: Option<Reason>,
    pub injection: Injection,
    pub secrets_written: usize,
}

pub async fn run(
    cluster: &Cluster,
    args: &SelfSignedArgs,
    now: DateTime<Utc>,
) -> Result<Report, Error> {
    args.policy().validate().map_err(Error::Config)?;
    retry_on_conflict(|| once(cluster, args, now)).await
}

async fn once(
    cluster: &Cluster,
    args: &SelfSignedArgs,
    now: DateTime<Utc>,
) -> Result<Report, Error> {
    let target = &args.target;
    let names = target.names(&cluster.namespace);
    let ca_secret = cluster.read_secret(&target.ca_secret()).await?;
    let serving_secret = cluster.read_secret(&target.secret).await?;
    let stored = Stored {
        ca: ca_secret.pair(),
        trust_bundle: ca_secret.data.get(CA_CRT).cloned(),
        serving: serving_secret.pair(),
    };
    let common_name = format!(
        "gpu-booking webhook CA ({}/{})",
        cluster.namespace, target.service
    );
    let outcome = plan::self_signed(&stored, &names, &common_name, now, &args.policy())?;

    let mut written = 0;
    let ca_data = BTreeMap::from([
        (TLS_CRT.to_owned(), outcome.ca.cert_pem.clone()),
        (TLS_KEY.to_owned(), outcome.ca.key_pem.clone()),
        (CA_CRT.to_owned(), outcome.trust_bundle.clone()),
    ]);
    if cluster
        .write_secret(&target.ca_secret(), &ca_secret, ca_data)
        .await?
    {
        written += 1;
    }
    let injection = inject(cluster, target, &outcome.trust_bundle).await?;
    let serving_data = BTreeMap::from([
        (TLS_CRT.to_owned(), outcome.serving.cert_pem.clone()),
        (TLS_KEY.to_owned(), outcome.serving.key_pem.clone()),
        (CA_CRT.to_owned(), outcome.trust_bundle.clone()),
    ]);
    if cluster
        .write_secret(&target.secret, &serving_secret, serving_data)
        .await?
    {
        written += 1;
    }
    Ok(Report {
        ca_renewed: outcome.ca_renewed,
        serving_renewed: outcome.serving_renewed,
        injection,
        secrets_written: written,
    })
}
