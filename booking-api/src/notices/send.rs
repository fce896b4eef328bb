//! The channels: e-mail over SMTP (lettre) and the outgoing webhook (reqwest).
//! Errors are plain text for the outbox and the log; none holds a password or the
//! webhook's URL.

use std::time::Duration;

use anyhow::Context;
use gpu_booking_core::notice::{message_id, webhook_body, Channel, Notice, WebhookFormat};
use lettre::message::{Mailbox, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::config::{read_secret, NoticeArgs, SmtpTls};

/// One delivery's time limit (connect, TLS, the whole exchange).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// The configured channels.
#[derive(Clone, Default)]
pub struct Senders {
    pub email: Option<EmailSender>,
    pub webhook: Option<WebhookSender>,
}

impl Senders {
    /// The channels `args` configure; secrets are read from their files now.
    pub fn from_args(args: &NoticeArgs) -> anyhow::Result<Senders> {
        let email = match &args.smtp_host {
            Some(host) => Some(EmailSender::from_args(host, args)?),
            None => None,
        };
        let webhook = match &args.notice_webhook_url_file {
            Some(path) => Some(WebhookSender::new(
                &read_secret(path)?,
                args.notice_webhook_format.into(),
            )?),
            None => None,
        };
        Ok(Senders { email, webhook })
    }

    pub fn channels(&self) -> super::Channels {
        super::Channels {
            email: self.email.is_some(),
            webhook: self.webhook.is_some(),
        }
    }

    /// Sends `notice` on `channel` (to `address` for e-mail), within [`SEND_TIMEOUT`]
    /// in all (lettre's timeout is per command).
    pub async fn send(
        &self,
        channel: Channel,
        address: Option<&str>,
        notice: &Notice<'_>,
    ) -> Result<(), String> {
        tokio::time::timeout(SEND_TIMEOUT, self.send_now(channel, address, notice))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", SEND_TIMEOUT.as_secs())))
    }

    async fn send_now(
        &self,
        channel: Channel,
        address: Option<&str>,
        notice: &Notice<'_>,
    ) -> Result<(), String> {
        match channel {
            Channel::Email => match (&self.email, address) {
                (Some(email), Some(to)) => email.send(to, notice).await,
                (None, _) => Err("e-mail is not configured on this replica".into()),
                (_, None) => Err("no address".into()),
            },
            Channel::Webhook => match &self.webhook {
                Some(webhook) => webhook.send(notice).await,
                None => Err("the webhook is not configured on this replica".into()),
            },
        }
    }
}

#[derive(Clone)]
pub struct EmailSender {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl EmailSender {
    fn from_args(host: &str, args: &NoticeArgs) -> anyhow::Result<EmailSender> {
        let from: Mailbox = args
            .smtp_from
            .parse()
            .with_context(|| format!("--smtp-from {:?} is not a mailbox", args.smtp_from))?;
        let tls = || -> anyhow::Result<TlsParameters> {
            let mut builder = TlsParameters::builder(host.to_owned());
            if let Some(path) = &args.smtp_ca_file {
                let pem =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                builder = builder.add_root_certificate(
                    Certificate::from_pem(&pem)
                        .context("--smtp-ca-file holds no PEM certificate")?,
                );
            }
            builder.build_rustls().context("SMTP TLS settings")
        };
        let (tls, port) = match args.smtp_tls {
            SmtpTls::Tls => (Tls::Wrapper(tls()?), 465),
            SmtpTls::Starttls => (Tls::Required(tls()?), 587),
            SmtpTls::None => (Tls::None, 25),
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .tls(tls)
            .port(args.smtp_port.unwrap_or(port))
            .timeout(Some(SEND_TIMEOUT));
        if let (Some(user), Some(path)) = (&args.smtp_username, &args.smtp_password_file) {
            builder = builder.credentials(Credentials::new(user.clone(), read_secret(path)?));
        }
        Ok(EmailSender {
            transport: builder.build(),
            from,
        })
    }

    async fn send(&self, to: &str, notice: &Notice<'_>) -> Result<(), String> {
        let message = self.message(to, notice)?;
        self.transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|e| format!("smtp: {e}"))
    }

    /// The mail of `notice` to `to`: MIME 1.0, one `text/plain; charset=utf-8` part
    /// whose transfer encoding lettre picks (7bit for plain ASCII, quoted-printable
    /// otherwise), a `Date` of now and the notice's own `Message-ID`. Spam filters
    /// and strict readers score a mail without these down or show it garbled.
    fn message(&self, to: &str, notice: &Notice<'_>) -> Result<Message, String> {
        let to: Mailbox = to.parse().map_err(|e| format!("address: {e}"))?;
        Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(notice.title)
            .message_id(Some(message_id(notice, self.from.email.domain())))
            .singlepart(SinglePart::plain(format!(
                // No newline at the end: lettre ends the part with one.
                "{}\n\n-- \ngpu-booking: change which notices you get on the booking page.",
                notice.text
            )))
            .map_err(|e| format!("message: {e}"))
    }
}

#[derive(Clone)]
pub struct WebhookSender {
    client: reqwest::Client,
    url: reqwest::Url,
    format: WebhookFormat,
}

impl WebhookSender {
    pub fn new(url: &str, format: WebhookFormat) -> anyhow::Result<WebhookSender> {
        // The URL is a secret: the error names neither it nor its parts.
        let url = reqwest::Url::parse(url)
            .map_err(|_| anyhow::anyhow!("the notice webhook URL is not a URL"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "https" | "http"),
            "the notice webhook URL must be http(s)"
        );
        let client = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("building the webhook client")?;
        Ok(WebhookSender {
            client,
            url,
            format,
        })
    }

    async fn send(&self, notice: &Notice<'_>) -> Result<(), String> {
        let answer = self
            .client
            .post(self.url.clone())
            .json(&webhook_body(self.format, notice))
            .send()
            .await
            .map_err(|e| format!("webhook: {}", e.without_url()))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("webhook answered HTTP {}", status.as_u16()))
        }
    }
}
