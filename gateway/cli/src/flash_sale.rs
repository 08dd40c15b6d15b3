//! `boxoffice flash-sale`: runs the sale (`boxoffice_drill::flash_sale`), prints its table,
//! writes its JSON if asked; exit code 2 if the sale broke a promise.

use std::process::ExitCode;

use anyhow::Context;
use boxoffice_drill::flash_sale::{self, FlashSaleArgs};

/// Runs the subcommand; its exit code.
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<ExitCode> {
    let json = args.json.clone();
    let report = flash_sale::run(args).await?;
    print!("{}", report.table());
    if let Some(path) = json {
        std::fs::write(&path, report.json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report.clean() {
        println!("result: every seat sold at most once; counters add up");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("result: FAILED: the sale broke a promise (see above)");
        Ok(ExitCode::from(2))
    }
}
