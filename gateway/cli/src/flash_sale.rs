//! `boxoffice flash-sale`: runs the sale (`boxoffice_drill::flash_sale`), prints its table,
//! writes its JSON if asked; exit code 3 if the sale broke a promise, 1 if only calls failed.

use anyhow::Context;
use boxoffice_drill::flash_sale::{self, FlashSaleArgs};

use crate::Exit;

/// Runs the subcommand; its exit code.
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Exit> {
    let json = args.json.clone();
    let report = flash_sale::run(args).await?;
    print!("{}", report.table());
    if let Some(path) = json {
        std::fs::write(&path, report.json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report.clean() {
        println!("result: every seat sold at most once; counters add up");
        Ok(Exit::Ok)
    } else if report.promises_kept() {
        println!("result: FAILED: calls failed (see above); every seat sold at most once");
        Ok(Exit::Failed)
    } else {
        println!("result: FAILED: the sale broke a promise (see above)");
        Ok(Exit::BrokenPromise)
    }
}
