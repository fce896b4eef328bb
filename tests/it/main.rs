//! The integration tests of the whole system, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod architecture;
mod common;
mod demo_jupyterhub;
mod demo_newcomer;
mod e2e_agent;
mod e2e_booking_end;
mod e2e_controller_bounds;
mod e2e_courses;
mod e2e_crash;
mod e2e_forged;
mod e2e_hub;
mod e2e_my_notebooks;
mod e2e_notebooks;
mod e2e_offers;
mod e2e_other_workloads;
mod e2e_real_hub;
mod e2e_service_accounts;
mod e2e_several_models;
mod e2e_spawn;
mod e2e_storm;
mod e2e_units;
mod e2e_upgrade;
mod e2e_waitlist;
mod e2e_webhook_down;
mod fatal_json;
mod kubectl;
mod server_limits;
