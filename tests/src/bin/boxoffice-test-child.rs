//! The child processes of the crash tests: `boxoffice-test-child ROLE`, its data dir named by
//! the role's variable. Roles: `kill9-sale` and `crash-after-charge`
//! ([`boxoffice_tests::children`]), `serve` ([`boxoffice_tests::server_process::serve`]). An
//! unknown role, or a missing variable, exits 2 without announcing itself (the parent fails).

use boxoffice_tests::{children, server_process};

fn main() {
    let role = std::env::args().nth(1).unwrap_or_default();
    let dir = |var: &str| {
        std::env::var(var).unwrap_or_else(|_| {
            eprintln!("boxoffice-test-child {role}: {var} is not set");
            std::process::exit(2)
        })
    };
    match role.as_str() {
        "kill9-sale" => children::kill9_sale(&dir(children::KILL9_DIR_VAR)),
        "crash-after-charge" => children::crash_after_charge(&dir(children::CHECKOUT_DIR_VAR)),
        "serve" => server_process::serve(&dir(server_process::DIR_VAR)),
        other => {
            eprintln!(
                "boxoffice-test-child: unknown role {other:?} (kill9-sale, crash-after-charge, serve)"
            );
            std::process::exit(2)
        }
    }
}
