//! The error that ends a process is a JSON log line when the process logs JSON,
//! and names the missing file it could not read.

use std::process::Command;

fn webhook_without_its_certificate(log_format: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-booking"))
        .args([
            "webhook",
            "--log-format",
            log_format,
            "--tls-cert",
            "/nonexistent-gpu-booking/tls.crt",
            "--tls-key",
            "/nonexistent-gpu-booking/tls.key",
            "--booking-url",
            "http://127.0.0.1:9",
            "--service-token",
            "not-a-secret",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env_remove("GPU_BOOKING_LOG_FORMAT")
        .env_remove("RUST_LOG")
        .output()
        .expect("gpu-booking runs")
}

#[test]
fn a_fatal_error_in_json_mode_is_one_json_line_naming_the_file() {
    let out = webhook_without_its_certificate("json");
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fatal: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["level"] == "ERROR")
        .collect();
    assert_eq!(fatal.len(), 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let error = fatal[0]["fields"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("/nonexistent-gpu-booking/tls.crt"),
        "{error}"
    );
    assert!(
        !stderr.contains("error:"),
        "a plain line besides the JSON one:\n{stderr}"
    );
    // Every line on stdout is JSON.
    for line in stdout.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
}

#[test]
fn in_plain_mode_it_stays_a_plain_line_on_stderr() {
    let out = webhook_without_its_certificate("plain");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: ") && stderr.contains("/nonexistent-gpu-booking/tls.crt"),
        "{stderr}"
    );
}
