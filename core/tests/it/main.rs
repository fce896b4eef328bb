//! The integration tests of gpu-booking-core, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod admission_props;
mod free_slots_props;
mod rules_model;
mod username_escapism_vectors;
mod username_fixtures;
