//! `boxoffice flash-sale`: runs the sale (`boxoffice_drill::flash_sale`), prints its table,
//! writes its JSON if asked; exit code 3 if the sale broke a promise (the naive baseline's
//! overselling too), 1 if only calls failed.

use boxoffice_drill::flash_sale::{self, FlashSaleArgs};

use crate::exit::Exit;

/// Runs the subcommand; its exit code.
pub async fn run(args: FlashSaleArgs) -> anyhow::Result<Exit> {
    let json = args.json.clone();
    let report = flash_sale::run(args).await?;
    print!("{}", report.table());
    let [clean, failed, broken] = report.result_lines();
    Ok(crate::exit::verdict(
        report.clean(),
        report.promises_kept(),
        [&clean, &failed, &broken],
        json.as_deref().map(|p| (p, report.json())),
    ))
}
