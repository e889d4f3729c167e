//! `flotilla`: see `flotilla --help`.

fn main() -> std::process::ExitCode {
    match flotilla_server::cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flotilla: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
