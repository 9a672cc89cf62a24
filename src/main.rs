use std::process::ExitCode;

use clap::Parser;
use colibri::cli::{Cli, Command, run, validate};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a).map(|_| true),
        Command::Validate(a) => validate::run(a),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
