//! `gpu-booking`: one binary, one subcommand per component.
#![forbid(unsafe_code)]

mod cli;
mod demo;
mod demo_args;
mod demo_cluster;
mod demo_signin;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // JSON too when the process logs JSON.
            gpu_booking_process::report_fatal(&e);
            std::process::ExitCode::FAILURE
        }
    }
}
