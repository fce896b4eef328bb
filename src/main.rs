//! `gpu-booking`: one binary, one subcommand per component.
#![forbid(unsafe_code)]

mod cli;
mod demo;
mod demo_args;
mod demo_cluster;
mod demo_jupyterhub;
mod demo_signin;

use clap::Parser;

/// mimalloc rather than glibc's malloc: a webhook review builds and drops a JSON tree
/// of a few hundred small allocations, which mimalloc's per-thread free lists serve
/// at a fraction of glibc's cost (docs/webhook.md, "Performance": the allocator).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Before the first burst of work: the delay applies to memory freed from now on.
    gpu_booking_process::allocator::delay_purges();
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
