mod auth;
mod bad_input;
mod effects;
mod reads;
mod tcp;
