//! `boxoffice completions SHELL` and `boxoffice man`: the command line described for shells and
//! for `man`, generated from the same definition that parses it (so a new subcommand or flag is
//! in both without anyone writing it twice).
//!
//! - completions: [`clap_complete`]'s script for bash, zsh, fish, elvish or PowerShell, on
//!   stdout;
//! - man pages: [`clap_mangen`]'s roff, `boxoffice.1` on stdout, or with `--out-dir` one page for
//!   the command and one for every subcommand at every depth (`boxoffice-serve.1`,
//!   `boxoffice-ticket-verify.1`, ...), each naming the pages of its subcommands.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use clap_complete::Shell;

use crate::exit::Exit;

/// `boxoffice completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `boxoffice man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write `boxoffice.1` and one page per subcommand (`boxoffice-serve.1`, ...) into this
    /// directory (made if missing) instead of printing `boxoffice.1`.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// The completion script of `shell` for `cmd`.
pub fn completion_script(shell: Shell, mut cmd: clap::Command) -> Vec<u8> {
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    script
}

/// Prints the completion script of `shell` for `cmd`.
pub fn completions(args: &CompletionsArgs, cmd: clap::Command) -> anyhow::Result<Exit> {
    print(&completion_script(args.shell, cmd)).context("writing the completion script")?;
    Ok(Exit::Ok)
}

/// Prints `cmd`'s page, or writes every page into `--out-dir` and lists them on stdout.
pub fn man(args: &ManArgs, cmd: clap::Command) -> anyhow::Result<Exit> {
    match &args.out_dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(with_subcommand_pages(cmd))
                .render(&mut page)
                .context("rendering the man page")?;
            print(&page).context("writing the man page")?;
        }
        Some(dir) => {
            let list: String = write_pages(cmd, dir)?
                .iter()
                .map(|p| format!("{}\n", p.display()))
                .collect();
            print(list.as_bytes()).context("listing the pages written")?;
        }
    }
    Ok(Exit::Ok)
}

/// Writes `bytes` to stdout; a reader that went away (`| head`) is not an error.
fn print(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Writes the page of `cmd` and of each of its subcommands at every depth into `dir`; returns
/// the files written, the command's first.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let mut cmd = with_subcommand_pages(cmd);
    // Sets each subcommand's full name (`boxoffice-ticket-verify`) and its usage line.
    cmd.build();
    let mut written = Vec::new();
    write_tree(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_tree(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut bytes = Vec::new();
    man.render(&mut bytes).context("rendering a man page")?;
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

/// `cmd` with a "see also" list naming each command's subcommand pages, at every depth.
fn with_subcommand_pages(cmd: clap::Command) -> clap::Command {
    fn walk(cmd: clap::Command, prefix: &str) -> clap::Command {
        let name = if prefix.is_empty() {
            cmd.get_name().to_owned()
        } else {
            format!("{prefix}-{}", cmd.get_name())
        };
        let pages: Vec<String> = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .map(|s| format!("{name}-{}(1)", s.get_name()))
            .collect();
        let cmd = if pages.is_empty() {
            cmd
        } else {
            let see_also = format!("See also: {}", pages.join(", "));
            let after = cmd
                .get_after_long_help()
                .or_else(|| cmd.get_after_help())
                .map(|a| format!("{a}\n\n{see_also}"))
                .unwrap_or(see_also);
            cmd.after_long_help(after)
        };
        cmd.mut_subcommands(|s| walk(s, &name))
    }
    walk(cmd, "")
}
