//! What every component's `/metrics` shares: `gpu_booking_build_info`, the process
//! metrics (Linux), and content negotiation between OpenMetrics (what
//! `prometheus-client` writes) and the Prometheus text format 0.0.4.
//!
//! A component keeps its families in a [`ComponentRegistry`]: the registry prefixed
//! `gpu_booking` with the component's sub-registry, so that every family is named
//! `gpu_booking_<component>_<name>` without a crate writing the prefix out. Its
//! [`ComponentRegistry::encode`] appends the shared families and the closing `# EOF`;
//! [`response`] answers with it in the format the request's `Accept` header picks.

use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

/// The content type of OpenMetrics text, which `prometheus-client` writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: &'static str,
    version: &'static str,
}

/// The families every component exports besides its own: `gpu_booking_build_info`
/// and `process_*`.
fn shared_registry(component: &'static str) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "gpu_booking_build",
        "The component and the version of gpu-booking it runs (always 1)",
        Info::new(BuildLabels {
            component,
            version: env!("CARGO_PKG_VERSION"),
        }),
    );
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// A component's metrics: the registry prefixed `gpu_booking` that `/metrics`
/// encodes, which holds the component's sub-registry (`gpu_booking_<component>`).
///
/// ```
/// use gpu_booking_process::metrics::ComponentRegistry;
/// use prometheus_client::metrics::{counter::Counter, histogram::Histogram};
/// use prometheus_client::registry::Unit;
///
/// let mut registry = ComponentRegistry::new("example");
/// let mut families = registry.families();
/// let jobs: Counter = families.add("jobs", "Jobs done", Counter::default());
/// let took = families.add_with_unit(
///     "job_duration",
///     "Time of a job",
///     Unit::Seconds,
///     Histogram::new([0.1, 1.0]),
/// );
/// jobs.inc();
/// took.observe(0.5);
/// let text = registry.encode();
/// assert!(text.contains("\ngpu_booking_example_jobs_total 1\n"));
/// assert!(text.contains("# TYPE gpu_booking_example_job_duration_seconds histogram\n"));
/// ```
#[derive(Debug)]
pub struct ComponentRegistry {
    root: Registry,
    component: &'static str,
}

impl ComponentRegistry {
    /// The prefix of every gpu-booking family.
    pub const PREFIX: &'static str = "gpu_booking";

    /// An empty registry for `component` (`api`, `webhook`, ...): the second word of
    /// its families' names and the `component` label of `gpu_booking_build_info`.
    pub fn new(component: &'static str) -> Self {
        Self {
            root: Registry::with_prefix(Self::PREFIX),
            component,
        }
    }

    /// The component's sub-registry, to register its families in. Each call adds one
    /// (a registry cannot hand back a sub-registry it made), so a component takes it
    /// once, in its `Metrics::new`.
    pub fn families(&mut self) -> Families<'_> {
        Families(self.root.sub_registry_with_prefix(self.component))
    }

    /// Families named `gpu_booking_<name>`, without the component's word: for a
    /// family that alert rules read by one name (`gpu_booking_database_up`). Like
    /// [`ComponentRegistry::families`], each call adds nothing but the families
    /// registered through it.
    pub fn unprefixed(&mut self) -> Families<'_> {
        Families(&mut self.root)
    }

    /// The OpenMetrics text of the component's families, then the shared ones
    /// (`gpu_booking_build_info`, `process_*`), then `# EOF`.
    pub fn encode(&self) -> String {
        encode(&self.root, self.component)
    }
}

/// A component's sub-registry ([`ComponentRegistry::families`]). Each `add` registers
/// a family and hands it back, for the component to keep and update: the registry
/// encodes a clone, which shares its values.
#[derive(Debug)]
pub struct Families<'a>(&'a mut Registry);

impl Families<'_> {
    /// Registers `metric` as `gpu_booking_<component>_<name>` (the encoder adds a
    /// counter's `_total`) with `help`, and returns it.
    pub fn add<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.0.register(name, help, metric.clone());
        metric
    }

    /// [`Families::add`] with a unit, which the name gets as its suffix
    /// (`_seconds`, `_bytes`, `_ratios`).
    pub fn add_with_unit<M: Metric + Clone>(
        &mut self,
        name: &str,
        help: &str,
        unit: Unit,
        metric: M,
    ) -> M {
        self.0.register_with_unit(name, help, unit, metric.clone());
        metric
    }
}

/// The OpenMetrics text of `registry`, then the shared families, then `# EOF`.
fn encode(registry: &Registry, component: &'static str) -> String {
    use prometheus_client::encoding::text;
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = text::encode_registry(&mut out, registry);
    let _ = text::encode_registry(&mut out, &shared_registry(component));
    let _ = text::encode_eof(&mut out);
    out
}

/// Which format a scraper asked for: OpenMetrics unless its `Accept` header prefers
/// `text/plain` (by q-value) or names only that. No header, `*/*` or anything else:
/// OpenMetrics.
pub fn wants_text(headers: &HeaderMap) -> bool {
    let mut openmetrics = None::<f32>;
    let mut text = None::<f32>;
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .filter_map(|q| q.parse::<f32>().ok())
                .next()
                .unwrap_or(1.0);
            let slot = match media.as_str() {
                "application/openmetrics-text" => &mut openmetrics,
                "text/plain" => &mut text,
                _ => continue,
            };
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
    }
    match (openmetrics, text) {
        (_, None) | (_, Some(0.0)) => false,
        (None, Some(_)) => true,
        (Some(o), Some(t)) => t > o,
    }
}

/// The `/metrics` answer: `openmetrics` as it is, or in the text format when the
/// request asks for it (see [`wants_text`]).
pub fn response(headers: &HeaderMap, openmetrics: String) -> Response {
    if wants_text(headers) {
        ([(header::CONTENT_TYPE, TEXT)], to_text(&openmetrics)).into_response()
    } else {
        ([(header::CONTENT_TYPE, OPENMETRICS)], openmetrics).into_response()
    }
}

/// OpenMetrics text as `prometheus-client` writes it, in the Prometheus text format
/// 0.0.4: a counter family `x` is described as `x_total` (its samples' name), an info
/// family `x` becomes the gauge `x_info`, `# UNIT` and `# EOF` lines go. (Otherwise a
/// text-format reader such as promtool sees each counter as two families.)
pub fn to_text(openmetrics: &str) -> String {
    let mut kinds = std::collections::HashMap::<&str, &str>::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                kinds.insert(name, kind);
            }
        }
    }
    let renamed = |name: &str| -> String {
        match kinds.get(name) {
            Some(&"counter") => format!("{name}_total"),
            Some(&"info") => format!("{name}_info"),
            _ => name.to_owned(),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", renamed(name)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = match kind {
                "info" | "stateset" => "gauge",
                "unknown" => "untyped",
                k => k,
            };
            out.push_str(&format!("# TYPE {} {kind}\n", renamed(name)));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The standard `process_*` metrics of client libraries, read from `/proc/self` at
/// each scrape (Linux; elsewhere nothing).
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` says; `None` for what could not be read.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<i64>,
    virtual_bytes: Option<i64>,
    start_time_seconds: Option<f64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
    threads: Option<i64>,
}

/// USER_HZ, the unit of /proc's times: 100 on every Linux architecture's ABI.
const TICKS_PER_SECOND: f64 = 100.0;

impl ProcessStats {
    fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let mut stats = Self::default();
        if let (Some(stat), Some(system)) = (read("/proc/self/stat"), read("/proc/stat")) {
            stats.parse_stat(&stat, &system);
        }
        if let Some(status) = read("/proc/self/status") {
            stats.parse_status(&status);
        }
        if let Some(limits) = read("/proc/self/limits") {
            stats.max_fds = parse_max_fds(&limits);
        }
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| i64::try_from(d.count()).unwrap_or(i64::MAX));
        stats
    }

    /// `/proc/self/stat` (after the command in parentheses: state is field 3, utime
    /// 14, stime 15, num_threads 20, starttime 22) and `/proc/stat`'s `btime`.
    fn parse_stat(&mut self, stat: &str, system: &str) {
        let Some((_, after)) = stat.rsplit_once(')') else {
            return;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        // fields[0] is field 3 (state).
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            self.cpu_seconds = Some((utime + stime) as f64 / TICKS_PER_SECOND);
        }
        self.threads = field(20).and_then(|t| i64::try_from(t).ok());
        let boot = system
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|b| b.trim().parse::<u64>().ok());
        if let (Some(boot), Some(start)) = (boot, field(22)) {
            self.start_time_seconds = Some(boot as f64 + start as f64 / TICKS_PER_SECOND);
        }
    }

    /// `VmRSS` and `VmSize` of `/proc/self/status`, in kB.
    fn parse_status(&mut self, status: &str) {
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
                .map(|v| v.saturating_mul(1024))
        };
        self.resident_bytes = kb("VmRSS:");
        self.virtual_bytes = kb("VmSize:");
    }
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn parse_max_fds(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if !cfg!(target_os = "linux") {
            return Ok(());
        }
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?;
            m.encode(e)?;
        }
        let gauges: [(&str, &str, Option<Unit>, Option<f64>); 6] = [
            (
                "process_resident_memory",
                "Resident memory size",
                Some(Unit::Bytes),
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size",
                Some(Unit::Bytes),
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(Unit::Seconds),
                s.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                None,
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Limit of open file descriptors",
                None,
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_threads",
                "OS threads of the process",
                None,
                s.threads.map(|v| v as f64),
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let m = ConstGauge::new(value);
            let e = encoder.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?;
            m.encode(e)?;
        }
        Ok(())
    }
}

/// Runs `promtool check metrics` on `text` (the text format): `None` when promtool is
/// not installed, else its verdict (`Err` with its output when it finds problems).
/// For the components' tests.
pub fn promtool_check(text: &str) -> Option<Result<(), String>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(text.as_bytes()));
    let output = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return Some(Err(e.to_string())),
    };
    if let Some(Err(e)) = written {
        return Some(Err(format!("writing to promtool: {e}")));
    }
    if output.status.success() {
        Some(Ok(()))
    } else {
        Some(Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;

    fn accept(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn negotiation_follows_the_accept_header() {
        assert!(!wants_text(&HeaderMap::new()));
        assert!(!wants_text(&accept("*/*")));
        assert!(wants_text(&accept("text/plain")));
        assert!(wants_text(&accept("text/plain; version=0.0.4")));
        assert!(!wants_text(&accept("application/openmetrics-text")));
        // What Prometheus sends: OpenMetrics first.
        assert!(!wants_text(&accept(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(wants_text(&accept(
            "application/openmetrics-text;q=0.2, text/plain;q=0.9"
        )));
        assert!(!wants_text(&accept("text/plain;q=0")));
    }

    fn sample() -> String {
        let mut registry = ComponentRegistry::new("test");
        let mut families = registry.families();
        let requests = families.add("requests", "Requests served", Counter::<u64>::default());
        let temp = families.add_with_unit(
            "free_memory",
            "Free memory",
            Unit::Bytes,
            Gauge::<i64>::default(),
        );
        // The registry encodes the values of the handles `add` returned.
        requests.inc();
        temp.set(3);
        registry.encode()
    }

    #[test]
    fn build_info_and_process_metrics_are_appended_once_before_eof() {
        let text = sample();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(
            text.contains(&format!(
                "gpu_booking_build_info{{component=\"test\",version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        if cfg!(target_os = "linux") {
            for name in [
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_start_time_seconds",
                "process_open_fds",
                "process_max_fds",
            ] {
                assert!(text.contains(&format!("\n{name} ")), "{name} in {text}");
            }
        }
    }

    #[test]
    fn the_text_format_names_counter_families_by_their_samples() {
        let text = to_text(&sample());
        assert!(
            text.contains("# TYPE gpu_booking_test_requests_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP gpu_booking_test_requests_total Requests served.\n"),
            "{text}"
        );
        assert!(
            text.contains("gpu_booking_test_requests_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\ngpu_booking_test_free_memory_bytes 3\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gpu_booking_build_info gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gpu_booking_test_free_memory_bytes gauge\n"),
            "{text}"
        );
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
        match promtool_check(&text) {
            None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
            Some(result) => result.unwrap(),
        }
    }

    #[test]
    fn proc_files_are_parsed() {
        let mut s = ProcessStats::default();
        // pid (comm with ) spaces) state ppid ... : utime=250 stime=50 threads=7 starttime=1000
        let stat = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 1000000 200 18446744073709551615";
        s.parse_stat(stat, "cpu  1 2 3\nbtime 1700000000\n");
        assert_eq!(s.cpu_seconds, Some(3.0));
        assert_eq!(s.threads, Some(7));
        assert_eq!(s.start_time_seconds, Some(1_700_000_010.0));
        s.parse_status("Name:\tx\nVmSize:\t  2048 kB\nVmRSS:\t  1024 kB\n");
        assert_eq!(
            (s.resident_bytes, s.virtual_bytes),
            (Some(1 << 20), Some(2 << 20))
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        // Garbage reads as nothing, never a panic.
        let mut g = ProcessStats::default();
        g.parse_stat("no parenthesis", "");
        g.parse_status("VmRSS: lots");
        assert_eq!(g, ProcessStats::default());
        assert_eq!(
            parse_max_fds("Max open files unlimited unlimited files"),
            None
        );
    }
}
