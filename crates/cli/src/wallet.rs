//! `neuroshard wallet new|show|address`: the node key that is also its ledger account.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use neuroshard_ledger::{LEDGER_FILE, Ledger, format_neuro};
use neuroshard_proof::{Identity, KEY_FILE};
use serde_json::json;

/// Where a node keeps its key file and ledger database.
#[derive(Args, Clone)]
pub struct DataDirArgs {
    /// Node data directory (holds node.key and ledger.db).
    #[arg(long, global = true, default_value = "neuroshard-data")]
    pub data_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

impl DataDirArgs {
    pub fn key_path(&self) -> PathBuf {
        self.data_dir.join(KEY_FILE)
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.data_dir.join(LEDGER_FILE)
    }

    pub fn load_identity(&self) -> Result<Identity> {
        let path = self.key_path();
        Identity::load(&path).with_context(|| {
            format!(
                "no usable node key at {} (create one with `neuroshard wallet new`)",
                path.display()
            )
        })
    }

    pub fn open_ledger(&self) -> Result<Ledger> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating {}", self.data_dir.display()))?;
        let path = self.ledger_path();
        Ledger::open(&path).with_context(|| format!("opening ledger {}", path.display()))
    }
}

#[derive(Args)]
pub struct WalletArgs {
    #[command(subcommand)]
    command: WalletCommand,
    #[command(flatten)]
    dirs: DataDirArgs,
}

#[derive(Subcommand)]
enum WalletCommand {
    /// Create a fresh random node key (refuses to overwrite an existing one).
    New,
    /// Show node id, public key, key file and ledger balance.
    Show,
    /// Print the node id (the ledger account address).
    Address,
}

pub fn run(args: WalletArgs) -> Result<()> {
    let dirs = &args.dirs;
    match args.command {
        WalletCommand::New => {
            let path = dirs.key_path();
            if path.exists() {
                bail!(
                    "{} already exists; refusing to replace a node key",
                    path.display()
                );
            }
            let identity = Identity::generate();
            identity
                .save_new(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            print_identity(dirs, &identity, &path, None)
        }
        WalletCommand::Show => {
            let identity = dirs.load_identity()?;
            let ledger_path = dirs.ledger_path();
            let account = if ledger_path.exists() {
                Some(dirs.open_ledger()?.state().account(&identity.node_id()))
            } else {
                None
            };
            print_identity(dirs, &identity, &dirs.key_path(), account)
        }
        WalletCommand::Address => {
            let identity = dirs.load_identity()?;
            if dirs.json {
                println!("{}", json!({ "node_id": identity.node_id() }));
            } else {
                println!("{}", identity.node_id());
            }
            Ok(())
        }
    }
}

fn print_identity(
    dirs: &DataDirArgs,
    identity: &Identity,
    key_path: &Path,
    account: Option<neuroshard_ledger::Account>,
) -> Result<()> {
    if dirs.json {
        let mut v = json!({
            "node_id": identity.node_id(),
            "public_key": identity.public_key(),
            "key_file": key_path,
        });
        if let Some(a) = account {
            v["account"] = serde_json::to_value(a)?;
        }
        println!("{v}");
    } else {
        println!("node id:    {}", identity.node_id());
        println!("public key: {}", identity.public_key());
        println!("key file:   {}", key_path.display());
        if let Some(a) = account {
            println!("balance:    {}", format_neuro(a.balance));
            println!("stake:      {}", format_neuro(a.stake));
        }
    }
    Ok(())
}
