//! `envelopes-bridge register NAME [--from-end]`: creates a consumer, at the
//! beginning of every feed or at its current end (egress needs one that exists,
//! unless it runs with `--register`).

use crate::cli::RegisterArgs;
use crate::logging::out;
use crate::retry::DbFailure;

/// `envelopes-bridge register NAME [--from-end]`.
pub async fn run(args: RegisterArgs) -> Result<(), DbFailure> {
    args.database.apply();
    let db = crate::db::connect(&args.database.database_url, "envelopes-bridge register")
        .await
        .map_err(DbFailure::from)?;
    db.client
        .execute(
            "SELECT envelopes.consumer_register($1, $2)",
            &[&args.name, &!args.from_end],
        )
        .await
        .map_err(|e| DbFailure::new(&e))?;
    out(format!(
        "consumer {:?} registered (at the {} of every feed)",
        args.name,
        if args.from_end { "end" } else { "beginning" }
    ));
    Ok(())
}
