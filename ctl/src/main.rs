//! `agentfleetctl`: parse, run, exit with the documented code (see `error::exit`).

use clap::Parser;

use agentfleet_ctl::{Cli, error::exit};

fn main() {
    let cli = Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentfleetctl: cannot start: {e}");
            std::process::exit(exit::UNAVAILABLE);
        }
    };
    let outcome = runtime.block_on(agentfleet_ctl::run(cli));
    // Streams may still be open; the runtime must not wait for them.
    runtime.shutdown_background();
    match outcome {
        Ok(()) => std::process::exit(exit::OK),
        Err(e) => {
            // A run's or batch's outcome was printed as the command's own document already.
            if json && !e.reported() {
                agentfleet_ctl::print_json(&e.to_json());
            }
            eprintln!("agentfleetctl: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
