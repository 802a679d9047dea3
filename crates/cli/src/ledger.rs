//! `neuroshard ledger balance|history|verdicts|fees|audits|stake|unstake|withdraw|transfer|
//! verify-proof|state-hash`.
//!
//! Until the network issue wires gossip in, ops are signed with the node key and applied to
//! the local ledger; the signed envelope is printed (`op_hex`) so it can be relayed.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use neuroshard_ledger::{AccountOp, Action, Outcome, format_neuro, parse_neuro, verify_op};
use neuroshard_proof::{NodeId, ProofVerifier, PublicKey, VerifyError};
use serde_json::json;

use crate::wallet::DataDirArgs;

#[derive(Args)]
pub struct LedgerArgs {
    #[command(subcommand)]
    command: LedgerCommand,
    #[command(flatten)]
    dirs: DataDirArgs,
}

#[derive(Subcommand)]
enum LedgerCommand {
    /// Balance and stake of an account (default: this node).
    Balance { account: Option<NodeId> },
    /// Newest-first history of an account (default: this node).
    History {
        account: Option<NodeId>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Audit verdicts this node's ledger applied (verification by recomputation): who was
    /// slashed for which job, and who was paid.
    Verdicts {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Validator fees this node's ledger paid: which auditor audited whose round.
    Fees {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Audits as this node's ledger holds them: fees paid and verdicts applied network-wide,
    /// and an account's share (default: this node): fees earned, stake slashed, rewards.
    Audits { account: Option<NodeId> },
    /// Lock NEURO as stake (raises the reward multiplier).
    Stake {
        /// Amount in NEURO, e.g. 12.5.
        amount: String,
        /// Lock duration in days (at least 1).
        #[arg(long, default_value_t = 1)]
        lock_days: u64,
    },
    /// Start unbonding unlocked stake: it stops counting as stake at once and can be withdrawn
    /// once the network's unbonding delay has passed (a day by default; until then it can
    /// still be slashed).
    Unstake { amount: String },
    /// Return unbonded stake whose unbonding delay has passed to the balance.
    Withdraw,
    /// Send NEURO to another node id (5 % is burned).
    Transfer { to: NodeId, amount: String },
    /// Verify a signed proof file (binary wire bytes or hex) through every check.
    VerifyProof {
        file: PathBuf,
        /// Verifier clock in ms since the epoch (default: now).
        #[arg(long)]
        now_ms: Option<u64>,
        /// Public keys of known nodes whose receipts count (repeatable).
        #[arg(long = "known")]
        known: Vec<PublicKey>,
        /// Credit the reward to the local ledger if the proof is valid.
        #[arg(long)]
        apply: bool,
    },
    /// Sign a payment for one completion entered at node ENTRY: PER_STAGE NEURO to each of
    /// the network's STAGES stages that serves it (10 % of it burned). Prints the hex to send
    /// as the request's `"payment"`; it applies only inside the entry node's settlement.
    PayInference {
        entry: NodeId,
        per_stage: String,
        #[arg(long, default_value_t = 2)]
        stages: u16,
    },
    /// BLAKE3 state hash over the whole ledger.
    StateHash,
}

fn now_ms() -> Result<u64> {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("system clock is before 1970")?;
    u64::try_from(d.as_millis()).context("clock overflow")
}

fn amount(text: &str) -> Result<u64> {
    parse_neuro(text).ok_or_else(|| anyhow!("{text:?} is not a NEURO amount (up to 9 decimals)"))
}

pub fn run(args: LedgerArgs) -> Result<()> {
    let dirs = &args.dirs;
    match args.command {
        LedgerCommand::Balance { account } => {
            let id = match account {
                Some(id) => id,
                None => dirs.load_identity()?.node_id(),
            };
            let a = dirs.open_ledger()?.state().account(&id);
            if dirs.json {
                println!(
                    "{}",
                    json!({ "account": id, "balance": a.balance, "stake": a.stake,
                    "unlock_at_ms": a.unlock_at_ms, "unbonding": a.unbonding,
                    "unbonding_until_ms": a.unbonding_until_ms, "next_nonce": a.next_nonce })
                );
            } else {
                println!("account {id}");
                println!("balance {}", format_neuro(a.balance));
                println!(
                    "stake   {} (unlocks at {} ms)",
                    format_neuro(a.stake),
                    a.unlock_at_ms
                );
                if a.unbonding > 0 {
                    println!(
                        "unbonding {} (withdrawable from {} ms)",
                        format_neuro(a.unbonding),
                        a.unbonding_until_ms
                    );
                }
            }
        }
        LedgerCommand::History { account, limit } => {
            let id = match account {
                Some(id) => id,
                None => dirs.load_identity()?.node_id(),
            };
            let lines = dirs.open_ledger()?.history(&id, limit)?;
            if dirs.json {
                println!("{}", serde_json::to_string(&lines)?);
            } else {
                for l in lines {
                    println!(
                        "{:>6} {:<13} {:>26} t={} ref={}",
                        l.seq,
                        l.kind,
                        format_neuro(l.amount),
                        l.timestamp_ms,
                        &l.reference[..16]
                    );
                }
            }
        }
        LedgerCommand::Verdicts { limit } => {
            let lines = dirs.open_ledger()?.verdicts(limit)?;
            if dirs.json {
                println!("{}", serde_json::to_string(&lines)?);
            } else {
                for v in lines {
                    println!(
                        "job {} offender {} slashed {} paid {} to {} t={}",
                        &v.job[..16],
                        &v.offender[..16],
                        format_neuro(v.slashed),
                        format_neuro(v.paid),
                        &v.beneficiary[..16],
                        v.timestamp_ms
                    );
                }
            }
        }
        LedgerCommand::Fees { limit } => {
            let lines = dirs.open_ledger()?.audit_fees(limit)?;
            if dirs.json {
                println!("{}", serde_json::to_string(&lines)?);
            } else {
                for f in lines {
                    println!(
                        "auditor {} paid {} for round {} of stage {} by {} (job {}) t={}",
                        &f.auditor[..16],
                        format_neuro(f.paid),
                        f.round,
                        f.stage,
                        &f.worker[..16],
                        &f.job[..16],
                        f.timestamp_ms
                    );
                }
            }
        }
        LedgerCommand::Audits { account } => {
            let id = match account {
                Some(id) => id,
                None => dirs.load_identity()?.node_id(),
            };
            let s = dirs.open_ledger()?.audit_summary(&id)?;
            if dirs.json {
                println!("{}", json!({ "account": id, "audits": s }));
            } else {
                println!(
                    "network: {} validator fees ({}), {} verdicts ({} slashed)",
                    s.fees,
                    format_neuro(s.fees_paid),
                    s.verdicts,
                    format_neuro(s.slashed)
                );
                println!(
                    "account {id}: {} fees ({}), slashed {}, slash rewards {}",
                    s.account_fees,
                    format_neuro(s.account_fees_paid),
                    format_neuro(s.account_slashed),
                    format_neuro(s.account_slash_rewards)
                );
            }
        }
        LedgerCommand::Stake {
            amount: a,
            lock_days,
        } => {
            let now = now_ms()?;
            let lock = lock_days.max(1).saturating_mul(24 * 60 * 60 * 1000);
            submit(
                dirs,
                now,
                Action::Stake {
                    amount: amount(&a)?,
                    unlock_at_ms: now.saturating_add(lock),
                },
            )?;
        }
        LedgerCommand::Unstake { amount: a } => {
            submit(
                dirs,
                now_ms()?,
                Action::Unstake {
                    amount: amount(&a)?,
                },
            )?;
        }
        LedgerCommand::Withdraw => submit(dirs, now_ms()?, Action::Withdraw)?,
        LedgerCommand::Transfer { to, amount: a } => {
            submit(
                dirs,
                now_ms()?,
                Action::Transfer {
                    to,
                    amount: amount(&a)?,
                },
            )?;
        }
        LedgerCommand::VerifyProof {
            file,
            now_ms: at,
            known,
            apply,
        } => verify_proof(dirs, &file, at, &known, apply)?,
        LedgerCommand::PayInference {
            entry,
            per_stage,
            stages,
        } => pay_inference(dirs, entry, amount(&per_stage)?, stages)?,
        LedgerCommand::StateHash => {
            let ledger = dirs.open_ledger()?;
            let hash = hex::encode(ledger.state_hash());
            if dirs.json {
                let s = ledger.state();
                println!(
                    "{}",
                    json!({ "state_hash": hash, "minted": s.minted(),
                    "burned": s.burned(), "proofs": s.proof_count() })
                );
            } else {
                println!("{hash}");
            }
        }
    }
    Ok(())
}

/// Signs an inference payment at this node's next nonce; it is not applied here (only the
/// entry node's settlement can apply it), so the nonce stays free until the node serves it.
fn pay_inference(dirs: &DataDirArgs, entry: NodeId, per_stage: u64, stages: u16) -> Result<()> {
    let identity = dirs.load_identity()?;
    let ledger = dirs.open_ledger()?;
    let account = identity.node_id();
    let state = ledger.state();
    let nonce = state.account(&account).next_nonce;
    let total = per_stage
        .checked_mul(u64::from(stages))
        .context("the fee overflows")?;
    if state.account(&account).balance < total {
        bail!(
            "the account holds {} NEURO; the payment may cost {}",
            format_neuro(state.account(&account).balance),
            format_neuro(total)
        );
    }
    let request: [u8; 32] = rand::random();
    let signed = AccountOp {
        network: state.rules().network,
        account,
        nonce,
        timestamp_ms: now_ms()?,
        action: Action::PayInference {
            entry,
            request,
            per_stage,
            stages,
        },
    }
    .sign(&identity);
    verify_op(&signed)?;
    let payment = hex::encode(signed.to_bytes());
    if dirs.json {
        println!(
            "{}",
            json!({ "payment": payment, "nonce": nonce, "request": hex::encode(request),
            "max_cost": total })
        );
    } else {
        println!("{payment}");
    }
    Ok(())
}

/// Signs an op for this node at its next nonce and applies it to the local ledger.
fn submit(dirs: &DataDirArgs, now: u64, action: Action) -> Result<()> {
    let identity = dirs.load_identity()?;
    let mut ledger = dirs.open_ledger()?;
    let account = identity.node_id();
    let nonce = ledger.state().account(&account).next_nonce;
    let signed = AccountOp {
        network: ledger.state().rules().network,
        account,
        nonce,
        timestamp_ms: now,
        action,
    }
    .sign(&identity);
    let verified = verify_op(&signed)?;
    let outcome = ledger.apply_op(verified)?;
    let applied = matches!(outcome, Outcome::Applied(_));
    let after = ledger.state().account(&account);
    if dirs.json {
        println!(
            "{}",
            json!({ "applied": applied, "nonce": nonce, "balance": after.balance,
            "stake": after.stake, "unbonding": after.unbonding,
            "unbonding_until_ms": after.unbonding_until_ms,
            "op_hex": hex::encode(signed.to_bytes()) })
        );
    } else {
        println!("applied op #{nonce}: {action:?}");
        println!(
            "balance {}  stake {}  unbonding {}",
            format_neuro(after.balance),
            format_neuro(after.stake),
            format_neuro(after.unbonding)
        );
    }
    if !applied {
        bail!("op was not applied: {outcome:?}");
    }
    Ok(())
}

fn verify_proof(
    dirs: &DataDirArgs,
    file: &PathBuf,
    at: Option<u64>,
    known: &[PublicKey],
    apply: bool,
) -> Result<()> {
    let raw = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    // Accept hex text too, so proofs can be pasted around.
    let bytes = match std::str::from_utf8(&raw).ok().map(str::trim) {
        Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit()) => {
            hex::decode(text).context("hex proof file")?
        }
        _ => raw,
    };
    let now = match at {
        Some(t) => t,
        None => now_ms()?,
    };
    let mut verifier = ProofVerifier::new();
    for key in known {
        verifier.add_known_node(*key);
    }
    let verdict: Result<_, VerifyError> = verifier.verify_bytes(&bytes, now);
    match verdict {
        Ok(v) => {
            let p = v.proof();
            let mut ledger = if apply {
                Some(dirs.open_ledger()?)
            } else {
                None
            };
            let amount = match &ledger {
                Some(l) => l.state().reward_for(p),
                None => neuroshard_ledger::LedgerState::new().reward_for(p),
            };
            let applied = match ledger.as_mut() {
                Some(l) => Some(matches!(l.apply_proof(&v)?, Outcome::Applied(_))),
                None => None,
            };
            if dirs.json {
                println!(
                    "{}",
                    json!({ "valid": true, "hash": hex::encode(v.hash()),
                    "node_id": p.node_id, "kind": format!("{:?}", p.kind), "nonce": p.nonce,
                    "reward": amount, "applied": applied })
                );
            } else {
                println!(
                    "valid {:?} proof {} from {}",
                    p.kind,
                    hex::encode(v.hash()),
                    p.node_id
                );
                println!("reward {}", format_neuro(amount));
                if let Some(a) = applied {
                    println!("applied to ledger: {a}");
                }
            }
            Ok(())
        }
        Err(e) => {
            if dirs.json {
                println!("{}", json!({ "valid": false, "error": e.to_string() }));
            }
            bail!("proof rejected: {e}")
        }
    }
}
