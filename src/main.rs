use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use colibri::cli::{
    Cli, Command, bench, chat, convert, doctor, models, plan, policy, quality, run, serve, synth, validate,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let trace = cli.command.engine_args().and_then(|a| a.trace.clone());
    let telemetry = match colibri::telemetry::init(trace.as_deref()) {
        Ok(guard) => guard,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            return ExitCode::from(1);
        }
    };
    let threads = cli
        .command
        .engine_args()
        .and_then(|a| a.threads)
        .map(|t| t as usize);
    let result = match cli.command {
        // Served commands run on the decode-loop and compute actors, which
        // own their threads (the compute pool is the compute actor's).
        Command::Serve(a) => serve::run(a).map(|_| true),
        Command::Chat(a) => chat::run(a).map(|_| true),
        Command::List(a) => models::list(a).map(|_| true),
        Command::Rm(a) => models::rm(a).map(|_| true),
        // The command itself runs on one of the compute threads, so the
        // thread that drives a forward pass also takes its share of every
        // matmul instead of sleeping while the others work.
        command => match rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .stack_size(16 << 20)
            .thread_name(|i| format!("coli-compute-{i}"))
            .build()
        {
            Ok(pool) => pool.install(move || match command {
                Command::Run(a) => run::run(a).map(|_| true),
                Command::Validate(a) => validate::run(a),
                Command::Quality(a) => quality::run(a).map(|_| true),
                Command::Convert(a) => convert::run(a).map(|_| true),
                Command::Synth(a) => synth::run(a).map(|_| true),
                Command::Bench(a) => bench::run(a),
                Command::Doctor(a) => doctor::run(a),
                Command::Plan(a) => plan::run(a).map(|_| true),
                Command::Policy(a) => policy::run(a).map(|_| true),
                Command::Serve(a) => serve::run(a).map(|_| true),
                Command::Chat(a) => chat::run(a).map(|_| true),
                Command::List(a) => models::list(a).map(|_| true),
                Command::Rm(a) => models::rm(a).map(|_| true),
            }),
            Err(e) => Err(anyhow::anyhow!("cannot start the compute threads: {e}")),
        },
    };
    // The trace is complete only now; a failed write is an error like any other.
    let result = match (result, telemetry.finish()) {
        (Ok(ok), Err(e)) => Err(anyhow::Error::new(e)).map(|()| ok),
        (r, _) => r,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // The reader of stdout went away: it wants nothing more, and the
        // command finished what it had to (README, "Exit codes").
        Err(e) if colibri::cli::output::is_stdout_closed(&e) => ExitCode::SUCCESS,
        // 2 is clap's code for usage errors (bad flags, also when found after
        // parsing); everything else (loading, I/O) is 1. A stderr that cannot
        // take the message changes nothing.
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", colibri::cli::error_chain(&e));
            ExitCode::from(if colibri::cli::is_usage_error(&e) { 2 } else { 1 })
        }
    }
}
